"""Random Relax graphs from the operator mix of real CNNs and transformers (issue 47).

Differential fuzzing: :func:`check_graph` compiles one random graph with
``tvm_rtask.compile(mod, target, **options)`` and compares every output, over two calls of
the same VM, with TVM's own build of the same module (``tvm.compile`` +
``relax.VirtualMachine``), and that build with a float64 numpy evaluation of the graph made
here, independently of TVM. A tvm-rtask mismatch is only a finding when the two references
agree; a disagreement between them is a generator (or TVM) defect and says so.

**What is drawn.** A graph is a :class:`GraphSpec`: one input (NCHW image or ``[batch,
tokens, features]``), then a list of :class:`Step` s, each a *motif* of real models expanded
into the primitive Relax operators an importer (``torch.export``) writes, as in
``/work/shared/repro/nan_fragment.json``: convolutions (strided, 1x1, depthwise, grouped,
dilated, non-square kernels; padding symmetric, none, asymmetric, TensorFlow's "same", and
the same as an explicit ``nn.pad`` before an unpadded convolution), explicit ``nn.pad`` alone
(bottom/right-only included), bias as ``add`` of an expanded constant, batch norm as
arithmetic (subtract the mean, divide by ``sqrt(var + eps)``, multiply, add), gates (ReLU,
ReLU6 as ``clip`` and as ``nn.relu6``, SiLU as ``sigmoid * x`` and as ``nn.silu``,
hard-swish as arithmetic, GELU erf and tanh, sigmoid), squeeze-and-excitation, residual
adds, concat, channel shuffle (reshape-transpose-reshape), max/average/global pooling,
ConvNeXt's channels-last layer norm and MLP (permute, layer norm, matmul, permute back),
image to tokens (reshape + permute, or flatten), dense (``permute_dims`` + ``matmul`` + bias
as torch imports ``linear``, or ``nn.linear``), layer norm, softmax, multi-head attention
(matmul-softmax-matmul with the reshapes and transposes), token transposes and reshapes,
activation-activation matmul and token mean pooling. Some motifs are whole blocks of real
CNNs, so that the operators meet in the order real models put them in: MBConv (MobileNet,
EfficientNet: expand, depthwise, SE, project, residual), ResNet's basic block, and a
downsampling stem (conv + BN + gate, then a stride-2 conv, often behind TensorFlow's
bottom/right-only explicit pad: the pattern of ``nan_fragment.json``). Steps no output
depends on are pruned, so a printed graph holds only what matters. Sizes are small
(channels 1-24, spatial 3-17, tokens 2-17): one graph compiles in about a second.

**Two sources, one generator.** The drawing code (:func:`draw_graph`) takes a
:class:`Chooser`: :func:`graphs` is the hypothesis strategy (draws through ``data.draw``, so
hypothesis shrinks a failing graph: fewer steps, simpler motifs, smaller sizes),
:func:`random_graph` the plain seeded builder (numpy) for CI sweeps and scripts. Choices are
ordered simplest first, and optional features shrink to "off".

**Values that stay alive.** Inputs are standard normal; convolution and dense weights are
He-scaled; batch-norm statistics are *calibrated* on the numpy twin's activations at that
point (mean and variance near the true ones), so every batch norm output is O(1) and a ReLU
after it keeps about half its inputs. :func:`build_graph` refuses (:class:`DeadGraph`) a
graph whose reference output is not finite, near zero or constant, so no comparison can
pass trivially; the tests reject those with hypothesis' ``assume``.

**Options.** :func:`option_sweep` is a deterministic covering array over ``fusion`` x
``policy`` x ``cpu_layout`` x ``num_veu`` x ``barrier``: every pair of values of two options
appears in some row, so a CI run that compiles one graph per row covers every value of
every option (and every pair) without the full product. :func:`fuzz_options` is the same
space as a hypothesis strategy. ``nan_fill=True`` is added to every compile when the
installed tvm-rtask has that option (:data:`HAS_NAN_FILL`), so a read of memory no kernel
wrote shows as NaN.

**Known defects.** :data:`KNOWN_BAD_OPTIONS` and :data:`KNOWN_BAD_GRAPHS` describe defects
already found and reported; the sweep and the hypothesis tests leave them out so that a run
finds something new, and ``tests/testing/regressions_random_graphs.py`` keeps each as a
strict expected failure that fails once it is fixed.

**Campaigns.** ``python -m tvm_rtask.testing.random_graphs --start 0 --count 500`` checks a
range of seeded graphs and prints every failure (no shrinking, no stop at the first).

Hypothesis is imported only by :func:`graphs` and :func:`fuzz_options` (a dev dependency).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------------------
# The option space

FUSIONS = ("fuseops", "stitch", "none")
CPU_LAYOUTS = ("nchw", "nchwc")
NUM_VEUS = (1, 2)
BARRIERS = ("fine", "global")
# the optimised build for some graphs, LLVM's -O0 (the same code generator, about three
# times faster to build) for the others, as tests/test_random_dags.py does
FAST_TARGET = {"kind": "llvm", "opt-level": 0}
FULL_TARGET = "llvm"


def policy_names() -> tuple[str, ...]:
    """The built-in policies (a policy a test registers for itself is not fuzzed)."""
    from ..policies.registry import BUILTIN_POLICIES

    return tuple(sorted(BUILTIN_POLICIES))


def option_space() -> dict[str, tuple]:
    """Every value of every fuzzed option, by option name."""
    return {
        "fusion": FUSIONS,
        "policy": policy_names(),
        "cpu_layout": CPU_LAYOUTS,
        "num_veu": NUM_VEUS,
        "barrier": BARRIERS,
    }


def _has_nan_fill() -> bool:
    from ..options import RTaskOptions

    return "nan_fill" in RTaskOptions.__dataclass_fields__


HAS_NAN_FILL = _has_nan_fill()


# Option combinations that fail for every graph, for a reason already reported: the sweep and
# the hypothesis strategy leave them out (so that they do not hide other findings) and
# tests/testing/regressions_random_graphs.py holds each as an expected failure, which turns
# into a failure once the bug is fixed (then delete the entry here).
KNOWN_BAD_OPTIONS: tuple[tuple[dict[str, Any], str], ...] = (
    # none now; num_veu=1 with barrier="global" was one until e4b7a66
)


def known_bad(options: dict[str, Any]) -> str | None:
    """Why ``options`` is a known failing combination (:data:`KNOWN_BAD_OPTIONS`), or None."""
    for combo, why in KNOWN_BAD_OPTIONS:
        if all(options.get(k) == v for k, v in combo.items()):
            return why
    return None


# Graphs (with options) that hit a defect already reported and not fixed yet: the hypothesis
# tests skip them (``assume``) so that a run finds something new instead of the same defect
# again; each has a strict expected failure in regressions_random_graphs.py, which fails
# once the defect is fixed (then delete the entry here).
def _stitch_batched_conv_to_tokens(spec: GraphSpec, options: dict, shapes: list[tuple]) -> bool:
    """A convolution's output of a batch larger than one turned into tokens and reshaped
    again, stitched into the convolution's kernel and cut into rTasks."""
    if options.get("fusion") != "stitch" or options.get("num_veu", 1) < 2 or shapes[0][0] < 2:
        return False
    convs = {i + 1 for i, s in enumerate(spec.steps) if s.op == "conv"}
    tokens = {i + 1 for i, s in enumerate(spec.steps) if s.op == "to_tokens" and s["src"] in convs}
    return any(s.op == "reshape" and s["src"] in tokens for s in spec.steps)


KNOWN_BAD_GRAPHS = (
    # two fusion="stitch" defects at 2 vEUs were here until the change that added
    # relax_passes.merged_reads and tir.coverage.repeated_blocks
    (
        _stitch_batched_conv_to_tokens,
        "fusion='stitch', 2 vEUs: a batch-2 convolution's output to tokens and reshaped, cut "
        "along the batch: TVM's FlattenBuffer fails ('Divide by zero') on the compacted "
        "intermediate; the compile fails loudly (no wrong answer)",
    ),
)


def known_bad_graph(spec: GraphSpec, options: dict, shapes: list[tuple]) -> str | None:
    """Why ``spec`` under ``options`` hits a known defect (:data:`KNOWN_BAD_GRAPHS`, and
    :data:`KNOWN_BAD_OPTIONS`), or None; ``shapes`` are the values' (``Built.shapes``)."""
    why = known_bad(options)
    if why:
        return why
    for hits, reason in KNOWN_BAD_GRAPHS:
        if hits(spec, options, shapes):
            return reason
    return None


def option_sweep() -> list[dict[str, Any]]:
    """A deterministic pairwise covering array of :func:`option_space`.

    Greedy: rows of the full product are taken, in product order, by how many not yet
    covered value pairs they cover, until every pair of values of every two options is in
    some row (15 rows for 3 fusions x 5 policies x 2 x 2 x 2, where the product is 120).
    Combinations of :data:`KNOWN_BAD_OPTIONS` are left out (and the pairs only they hold).
    """
    space = option_space()
    names = list(space)
    pairs_of = {
        row: {
            ((a, row[i]), (b, row[j]))
            for (i, a), (j, b) in itertools.combinations(enumerate(names), 2)
        }
        for row in itertools.product(*space.values())
        if not known_bad(dict(zip(names, row, strict=True)))
    }
    missing = set().union(*pairs_of.values())
    rows = []
    while missing:
        best = max(pairs_of, key=lambda r: len(pairs_of[r] & missing))
        rows.append(dict(zip(names, best, strict=True)))
        missing -= pairs_of.pop(best)
    return rows


def fuzz_options():
    """Hypothesis strategy: one value of each fuzzed option (a dict of compile keywords),
    :data:`KNOWN_BAD_OPTIONS` left out."""
    from hypothesis import strategies as st

    every = st.fixed_dictionaries({k: st.sampled_from(v) for k, v in option_space().items()})
    return every.filter(lambda o: known_bad(o) is None)


def compile_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` as passed to ``tvm_rtask.compile``: ``nan_fill=True`` added when it exists."""
    out = dict(options)
    if HAS_NAN_FILL:
        out.setdefault("nan_fill", True)
    return out


# ---------------------------------------------------------------------------------------------
# Graph descriptions


class Step:
    """One motif: its kind (``op``), the value(s) it reads (``src``, ``other``, indices into
    the graph's values, input first) and its realised parameters. ``repr`` is valid Python,
    so a shrunk example prints as code that rebuilds it."""

    def __init__(self, op: str, **attrs: Any):
        self.op = op
        self.attrs = attrs

    def __getitem__(self, key: str) -> Any:
        return self.attrs[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Step) and (self.op, self.attrs) == (other.op, other.attrs)

    def __hash__(self) -> int:
        return hash((self.op, tuple(sorted(self.attrs.items()))))

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.attrs.items())
        return f"Step({self.op!r}{args})"


@dataclass(frozen=True)
class GraphSpec:
    """A random graph: the input's shape, the steps (value ``i + 1`` is step ``i``'s
    output, value 0 the input), the values returned and the seed of the weights."""

    input_shape: tuple[int, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    seed: int = 0

    def __repr__(self) -> str:
        steps = "".join(f"\n        {s!r}," for s in self.steps)
        return (
            f"GraphSpec(\n    input_shape={self.input_shape!r},\n    steps=({steps}\n    ),\n"
            f"    outputs={self.outputs!r},\n    seed={self.seed!r},\n)"
        )

    def motifs(self) -> set[str]:
        """The motif variants this graph holds (``conv:depthwise``, ``act:gelu``, ...)."""
        return {v for s in self.steps for v in _variants(s)}


def _variants(step: Step) -> list[str]:
    out = [step.op]
    a = step.attrs
    if "block" in a:
        out.append(f"block:{a['block']}")
    if step.op == "conv":
        kh, kw = a["kernel"]
        out.append(f"conv:{a['groups_kind']}")
        out.append("conv:1x1" if (kh, kw) == (1, 1) else "conv:kxk" if kh == kw else "conv:kh!=kw")
        if a["stride"] > 1:
            out.append("conv:strided")
        if a["dilation"] > 1:
            out.append("conv:dilated")
        out.append(f"conv:pad_{a['pad_kind']}")
        if a["explicit_pad"]:
            out.append("conv:explicit_pad")
        if a["bias"]:
            out.append("conv:bias")
        if a["bn"]:
            out.append("bn")
    if step.op == "pad":
        t, left, b, r = a["pad"]
        if t == left == 0 and (b or r):
            out.append("pad:bottom_right_only")
        elif (t, left) == (b, r):
            out.append("pad:symmetric")
        else:
            out.append("pad:asymmetric")
    if step.op == "pool":
        out.append(f"pool:{a['kind']}")
    if step.op in ("gpool", "se", "to_tokens", "dense", "attention", "act", "cl_block"):
        for key in ("mode", "style", "gate", "scale"):
            if key in a:
                out.append(f"{step.op}:{a[key]}")
    for key in ("act", "inner"):
        if a.get(key):
            out.append(f"act:{a[key]}")
    if step.op == "act":
        out.append(f"act:{a['name']}")
    if step.op == "cl_block" and a.get("mlp"):
        out.append("cl_block:mlp")
    return out


# every motif variant a large enough sample of graphs holds (test_random_graphs checks it)
ACTIVATIONS = (
    "relu",
    "relu6",
    "relu6_op",
    "silu",
    "silu_op",
    "hardswish",
    "gelu",
    "gelu_tanh",
    "sigmoid",
)
IMAGE_MOTIFS = (
    "conv",
    "pad",
    "bn",
    "act",
    "pool",
    "gpool",
    "se",
    "shuffle",
    "add",
    "concat",
    "cl_block",
    "to_tokens",
    "softmax",
)
TOKEN_MOTIFS = (
    "dense",
    "layer_norm",
    "softmax",
    "attention",
    "act",
    "add",
    "concat",
    "transpose",
    "reshape",
    "bmm",
    "token_pool",
)
MOTIFS = tuple(dict.fromkeys(IMAGE_MOTIFS + TOKEN_MOTIFS))


# ---------------------------------------------------------------------------------------------
# Choosers: where the random choices come from


class Chooser:
    """The random choices :func:`draw_graph` makes; simplest value first, so that hypothesis
    shrinks towards it."""

    def integer(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def choice(self, options: Sequence) -> Any:
        return options[self.integer(0, len(options) - 1)]

    def chance(self, percent: int) -> bool:
        """True about ``percent`` % of the time; shrinks to False."""
        return self.integer(0, 99) >= 100 - percent

    def recent(self, n: int) -> int:
        """An index into ``n`` candidates, the last one about half the time (motifs mostly
        read the newest value, as a model's layers do); shrinks to the last."""
        back = max(0, self.integer(0, 2 * (n - 1)) - (n - 1))
        return n - 1 - back


class NumpyChooser(Chooser):
    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))


class HypothesisChooser(Chooser):
    def __init__(self, draw):
        from hypothesis import strategies as st

        self.draw = draw
        self.st = st

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(self.st.integers(lo, hi)) if hi > lo else lo

    def choice(self, options: Sequence) -> Any:
        return self.draw(self.st.sampled_from(list(options))) if len(options) > 1 else options[0]


# ---------------------------------------------------------------------------------------------
# Drawing a graph (shapes only; values come with build_graph)

MAX_CHANNELS = 24
MAX_CONCAT = 48
MAX_SPATIAL = 17
MAX_TOKENS = 17


def _divisors(n: int, lo: int = 2, hi: int | None = None) -> list[int]:
    hi = n if hi is None else min(n, hi)
    return [d for d in range(lo, hi + 1) if n % d == 0]


def _conv_out(size: int, k: int, s: int, d: int, lo: int, hi: int) -> int:
    return (size + lo + hi - d * (k - 1) - 1) // s + 1


def _tf_same(size: int, k: int, s: int, d: int) -> tuple[int, int]:
    """TensorFlow's "same" padding of one axis: the extra row/column goes bottom/right."""
    total = max((math.ceil(size / s) - 1) * s + d * (k - 1) + 1 - size, 0)
    return total // 2, total - total // 2


def _draw_conv(c: Chooser, shape) -> tuple[dict, tuple]:
    n, ch, h, w = shape
    kernel = c.choice(((1, 1), (3, 3), (1, 1), (3, 3), (5, 5), (1, 3), (3, 1), (2, 2), (7, 7)))
    stride = c.choice((1, 2))
    dilation = 2 if kernel != (1, 1) and c.chance(10) else 1
    pad_kind = c.choice(("same", "none", "same", "tf_same", "asym"))
    kh, kw = kernel
    if pad_kind == "same":
        pad = (dilation * (kh // 2), dilation * (kw // 2)) * 2
    elif pad_kind == "none":
        pad = (0, 0, 0, 0)
    elif pad_kind == "tf_same":
        (t, b), (left, r) = _tf_same(h, kh, stride, dilation), _tf_same(w, kw, stride, dilation)
        pad = (t, left, b, r)
    else:
        pad = tuple(c.integer(0, max(k - 1, 1)) for k in (kh, kw, kh, kw))
    oh = _conv_out(h, kh, stride, dilation, pad[0], pad[2])
    ow = _conv_out(w, kw, stride, dilation, pad[1], pad[3])
    if oh < 1 or ow < 1:  # too small for this kernel: a 1x1 convolution instead
        kernel, dilation, pad_kind, pad = (1, 1), 1, "none", (0, 0, 0, 0)
        oh, ow = _conv_out(h, 1, stride, 1, 0, 0), _conv_out(w, 1, stride, 1, 0, 0)
    groups_kind = c.choice(("dense", "dense", "depthwise", "grouped"))
    if groups_kind == "depthwise":
        groups = ch
        out = ch * c.choice((1, 2)) if ch * 2 <= MAX_CHANNELS else ch
    elif groups_kind == "grouped" and _divisors(ch, 2, ch - 1):
        groups = c.choice(_divisors(ch, 2, ch - 1))
        out = groups * c.integer(1, max(1, MAX_CHANNELS // groups))
    else:
        groups_kind, groups = "dense", 1
        out = c.integer(1, MAX_CHANNELS)
    explicit = any(pad) and c.chance(35)
    attrs = dict(
        out=out,
        kernel=kernel,
        stride=stride,
        dilation=dilation,
        pad=pad,
        pad_kind=pad_kind,
        explicit_pad=explicit,
        groups=groups,
        groups_kind=groups_kind,
        bias=c.chance(50),
        bn=c.chance(60),
        act=c.choice(ACTIVATIONS) if c.chance(70) else None,
    )
    return attrs, (n, out, oh, ow)


def _conv_step(
    src: int,
    shape: tuple,
    out: int,
    k: int,
    stride: int,
    pad_kind: str,
    act: str | None,
    groups: int = 1,
    bn: bool = True,
    **extra,
) -> tuple[Step, tuple]:
    """A convolution of a block: square kernel, "same" (symmetric) or no padding."""
    n, ch, h, w = shape
    p = k // 2 if pad_kind == "same" else 0
    step = Step(
        "conv",
        src=src,
        out=out,
        kernel=(k, k),
        stride=stride,
        dilation=1,
        pad=(p, p, p, p),
        pad_kind=pad_kind,
        explicit_pad=False,
        groups=groups,
        groups_kind="dense" if groups == 1 else "depthwise" if groups == ch else "grouped",
        bias=False,
        bn=bn,
        act=act,
        **extra,
    )
    return step, (n, out, _conv_out(h, k, stride, 1, p, p), _conv_out(w, k, stride, 1, p, p))


def _strided_conv(
    c: Chooser,
    shapes: list,
    src: int,
    out: int,
    k: int,
    stride: int,
    act: str | None,
    groups: int = 1,
) -> list[tuple[Step, tuple]]:
    """A block's (possibly strided) kxk convolution: its own symmetric padding, or
    TensorFlow's "same" padding as an explicit ``nn.pad`` (bottom/right only for a stride-2
    convolution of an even size) before an unpadded convolution, as TF ports write it."""
    shape = shapes[src]
    if stride == 1 or not c.chance(50):
        return [_conv_step(src, shape, out, k, stride, "same", act, groups)]
    n, ch, h, w = shape
    (t, b), (left, r) = _tf_same(h, k, stride, 1), _tf_same(w, k, stride, 1)
    padded = (n, ch, h + t + b, w + left + r)
    pad = (Step("pad", src=src, pad=(t, left, b, r), value=0.0), padded)
    return [pad, _conv_step(len(shapes), padded, out, k, stride, "none", act, groups)]


def _draw_block(c: Chooser, shapes: list, src: int, kind: str) -> list[tuple[Step, tuple]]:
    """The steps of one block of a real CNN reading value ``src``:

    - ``mbconv`` (MobileNetV2/V3, EfficientNet): 1x1 expansion + BN + gate, depthwise kxk
      (strided, maybe TF-padded) + BN + gate, squeeze-and-excitation, 1x1 projection + BN,
      residual add when the shape allows;
    - ``resblock`` (ResNet basic block): 3x3 + BN + ReLU, 3x3 + BN, shortcut (identity or
      strided 1x1 + BN), add, ReLU;
    - ``downsample`` (a stem, nan_fragment.json): kxk + BN + gate, then a stride-2 3x3 +
      BN + gate, often TF-padded: the pad follows the gate directly.
    """
    out: list[tuple[Step, tuple]] = []
    shape = shapes[src]
    n, ch, h, w = shape

    def add(items):
        for step, sh in items:
            out.append((step, sh))
        return len(shapes) + len(out) - 1  # the index of the last value added

    cur_shapes = lambda: shapes + [sh for _, sh in out]  # noqa: E731
    if kind == "mbconv":
        act = c.choice(("silu", "relu6", "hardswish", "relu"))
        ratio = c.choice((1, 2, 3, 4, 6))
        k = c.choice((3, 5))
        stride = c.choice((1, 2))
        mid = min(ch * ratio, MAX_CHANNELS) if ratio > 1 else ch
        x = src
        if ratio > 1:
            x = add([_conv_step(src, shape, mid, 1, 1, "none", act, block="mbconv")])
        x = add(_strided_conv(c, cur_shapes(), x, mid, k, stride, act, groups=mid))
        if c.chance(50):
            hard = act == "hardswish"  # MobileNetV3: ReLU inside, hard sigmoid gate
            se = Step(
                "se",
                src=x,
                reduced=max(1, mid // 4),
                inner="relu" if hard else act,
                gate="hardsigmoid" if hard else "sigmoid",
                mode="mean",
            )
            x = add([(se, cur_shapes()[x])])
        proj = c.integer(1, MAX_CHANNELS)
        x = add([_conv_step(x, cur_shapes()[x], proj, 1, 1, "none", None)])
        if cur_shapes()[x] == shape:
            add([(Step("add", src=x, other=src), shape)])
        if ratio == 1 and len(out) and "block" not in out[0][0].attrs:
            out[0][0].attrs["block"] = "mbconv"
        return out
    if kind == "resblock":
        width = c.integer(1, MAX_CHANNELS)
        stride = c.choice((1, 2))
        x = add(_strided_conv(c, shapes, src, width, 3, stride, "relu"))
        out[0][0].attrs["block"] = "resblock"
        x = add([_conv_step(x, cur_shapes()[x], width, 3, 1, "same", None)])
        short = src
        if cur_shapes()[x] != shape:
            short = add([_conv_step(src, shape, width, 1, stride, "none", None)])
        y = add([(Step("add", src=x, other=short), cur_shapes()[x])])
        add([(Step("act", src=y, name="relu"), cur_shapes()[y])])
        return out
    if kind == "downsample":
        act = c.choice(("silu", "relu"))
        x = add(
            [
                _conv_step(
                    src,
                    shape,
                    c.integer(1, MAX_CHANNELS),
                    c.choice((1, 3)),
                    1,
                    "same",
                    act,
                    block="downsample",
                )
            ]
        )
        add(_strided_conv(c, cur_shapes(), x, c.integer(1, MAX_CHANNELS), 3, 2, act))
        return out
    raise AssertionError(kind)


BLOCKS = ("mbconv", "resblock", "downsample")


def _draw_step(c: Chooser, shapes: list[tuple]) -> list[tuple[Step, tuple]] | None:
    """The steps of one motif reading the values of ``shapes``, each with its output shape;
    None when the motif drawn does not apply to the value drawn."""
    drawn = _draw_one(c, shapes)
    if drawn is None or isinstance(drawn, list):
        return drawn
    return [drawn]


def _draw_one(c: Chooser, shapes: list[tuple]):
    src = c.recent(len(shapes))
    shape = shapes[src]
    if len(shape) == 4:
        op = c.choice(
            (
                "conv",
                "conv",
                "conv",
                "act",
                "bn",
                "pad",
                "add",
                "pool",
                "gpool",
                "se",
                "concat",
                "shuffle",
                "cl_block",
                "to_tokens",
                "softmax",
                *BLOCKS,
            )
        )
        if op in BLOCKS:
            if min(shape[2:]) < 3:
                return None
            return _draw_block(c, shapes, src, op)
    else:
        op = c.choice(
            (
                "dense",
                "dense",
                "act",
                "layer_norm",
                "attention",
                "softmax",
                "add",
                "concat",
                "transpose",
                "reshape",
                "bmm",
                "token_pool",
            )
        )
    n = shape[0]
    if op == "conv":
        attrs, out = _draw_conv(c, shape)
        return Step("conv", src=src, **attrs), out
    if op == "act":
        return Step("act", src=src, name=c.choice(ACTIVATIONS)), shape
    if op == "bn":
        return Step("bn", src=src, act=c.choice(ACTIVATIONS) if c.chance(50) else None), shape
    if op == "pad":
        kind = c.choice(("bottom_right", "symmetric", "asym"))
        if kind == "bottom_right":
            pad = (0, 0, c.integer(0, 2), c.integer(0, 2))
            if pad == (0, 0, 0, 0):
                pad = (0, 0, 1, 1)
        elif kind == "symmetric":
            p = c.integer(1, 2)
            pad = (p, p, p, p)
        else:
            pad = tuple(c.integer(0, 2) for _ in range(4))
        value = 0.0 if not c.chance(10) else -1.0
        t, left, b, r = pad
        return Step("pad", src=src, pad=pad, value=value), (
            n,
            shape[1],
            shape[2] + t + b,
            shape[3] + left + r,
        )
    if op in ("add", "concat"):
        if op == "add":
            others = [i for i, s in enumerate(shapes) if s == shape and i != src]
        elif len(shape) == 4:
            others = [
                i
                for i, s in enumerate(shapes)
                if len(s) == 4
                and (s[0], s[2], s[3]) == (n, shape[2], shape[3])
                and s[1] + shape[1] <= MAX_CONCAT
            ]
        else:
            others = [
                i
                for i, s in enumerate(shapes)
                if len(s) == len(shape) and s[:-1] == shape[:-1] and s[-1] + shape[-1] <= MAX_CONCAT
            ]
        if not others:
            return None
        other = others[c.recent(len(others))]
        if op == "add":
            return Step("add", src=src, other=other), shape
        axis = 1 if len(shape) == 4 else len(shape) - 1
        out = list(shape)
        out[axis] += shapes[other][axis]
        return Step("concat", src=src, other=other), tuple(out)
    if op == "pool":
        kind = c.choice(("max", "avg"))
        k = c.choice((2, 3))
        s = c.choice((1, 2))
        p = c.integer(0, k // 2)
        oh, ow = (_conv_out(x, k, s, 1, p, p) for x in shape[2:])
        if oh < 1 or ow < 1:
            return None
        return Step(
            "pool",
            src=src,
            kind=kind,
            k=k,
            stride=s,
            pad=p,
            count_include_pad=kind == "avg" and c.chance(50),
        ), (n, shape[1], oh, ow)
    if op == "gpool":
        return Step("gpool", src=src, mode=c.choice(("mean", "adaptive"))), (n, shape[1], 1, 1)
    if op == "se":
        ch = shape[1]
        return Step(
            "se",
            src=src,
            reduced=c.integer(1, max(1, ch // 2)),
            inner=c.choice(("relu", "silu")),
            gate=c.choice(("sigmoid", "hardsigmoid")),
            mode=c.choice(("mean", "adaptive")),
        ), shape
    if op == "shuffle":
        groups = _divisors(shape[1], 2, 4)
        if not groups:
            return None
        return Step("shuffle", src=src, groups=c.choice(groups)), shape
    if op == "cl_block":
        mlp = c.integer(1, MAX_CHANNELS) if c.chance(50) else None
        out = (n, mlp or shape[1], shape[2], shape[3])
        act = c.choice(("gelu", "relu")) if mlp else None
        return Step("cl_block", src=src, mlp=mlp, act=act), out
    if op == "to_tokens":
        mode = c.choice(("tokens", "flatten"))
        if mode == "tokens":
            return Step("to_tokens", src=src, mode=mode), (n, shape[2] * shape[3], shape[1])
        return Step("to_tokens", src=src, mode=mode), (n, shape[1] * shape[2] * shape[3])
    if op == "softmax":  # over the channels of an image; the features or the tokens
        axis = 1 if len(shape) == 4 else len(shape) - 1
        if len(shape) == 3 and c.chance(25):
            axis = 1
        if shape[axis] < 2:  # a softmax over one element is the constant 1
            return None
        return Step("softmax", src=src, axis=axis), shape
    if op == "dense":
        out = c.integer(1, MAX_CHANNELS)
        return Step(
            "dense",
            src=src,
            out=out,
            style=c.choice(("torch", "linear", "matmul")),
            bias=c.chance(60),
            act=c.choice(ACTIVATIONS) if c.chance(40) else None,
        ), (*shape[:-1], out)
    if op == "layer_norm":
        return Step("layer_norm", src=src, eps=c.choice((1e-5, 1e-6))), shape
    if op == "attention":
        if len(shape) != 3:
            return None
        heads = c.choice([1, *_divisors(shape[2], 2, 4)])
        return Step(
            "attention",
            src=src,
            heads=heads,
            scale=c.choice(("multiply", "divide")),
            proj=c.chance(60),
        ), shape
    if op == "transpose":
        if len(shape) != 3:
            return None
        return Step("transpose", src=src), (n, shape[2], shape[1])
    if op == "reshape":
        if len(shape) != 3:
            return None
        total = shape[1] * shape[2]
        options = [d for d in _divisors(total, 1, MAX_CHANNELS) if d != shape[2]]
        if not options:
            return None
        d = c.choice(options)
        return Step("reshape", src=src, features=d), (n, total // d, d)
    if op == "bmm":
        if len(shape) != 3:
            return None
        others = [i for i, s in enumerate(shapes) if len(s) == 3 and (s[0], s[2]) == (n, shape[2])]
        other = others[c.recent(len(others))]
        return Step("bmm", src=src, other=other), (n, shape[1], shapes[other][1])
    if op == "token_pool":
        if len(shape) != 3:
            return None
        return Step("token_pool", src=src), (n, shape[2])
    raise AssertionError(op)


FAMILIES = ("image", "tokens")


def draw_graph(
    c: Chooser,
    max_steps: int = 8,
    min_steps: int = 1,
    seed: int | None = None,
    family: str | None = None,
) -> GraphSpec:
    """A random :class:`GraphSpec` from the choices of ``c``: an image graph (NCHW input,
    CNN motifs, possibly turned into tokens) or a token graph (``[batch, tokens,
    features]``, transformer motifs); ``family`` None draws which."""
    family = family or c.choice(FAMILIES)
    batch = c.choice((1, 2))
    if family == "image":
        h = c.integer(3, MAX_SPATIAL)
        w = h if c.chance(70) else c.integer(3, MAX_SPATIAL)
        shape = (batch, c.integer(1, MAX_CHANNELS), h, w)
    else:
        shape = (batch, c.integer(2, MAX_TOKENS), c.integer(1, MAX_CHANNELS))
    shapes = [shape]
    steps: list[Step] = []
    wanted = c.integer(min_steps, max_steps)
    motifs = tries = 0
    while motifs < wanted and tries < 4 * max_steps:
        tries += 1
        drawn = _draw_step(c, shapes)
        if drawn is None:
            continue
        motifs += 1
        for step, out in drawn:
            steps.append(step)
            shapes.append(out)
    outputs = (len(shapes) - 1,)
    if len(shapes) > 2 and c.chance(25):  # an intermediate value returned too
        outputs = (*outputs, c.integer(1, len(shapes) - 2))
    if seed is None:
        seed = c.integer(0, 2**16)
    return _prune(GraphSpec(shape, tuple(steps), outputs, seed))


def _prune(spec: GraphSpec) -> GraphSpec:
    """``spec`` without the steps no output depends on (Relax's dead-code elimination
    would drop them anyway), values renumbered: a shrunk example prints only what matters."""
    live = set(spec.outputs)
    for i in range(len(spec.steps), 0, -1):
        if i in live:
            a = spec.steps[i - 1].attrs
            live |= {a[k] for k in ("src", "other") if k in a}
    kept = [i for i in range(1, len(spec.steps) + 1) if i in live]
    new = {0: 0, **{old: k + 1 for k, old in enumerate(kept)}}
    steps = []
    for i in kept:
        s = spec.steps[i - 1]
        attrs = {k: new[v] if k in ("src", "other") else v for k, v in s.attrs.items()}
        steps.append(Step(s.op, **attrs))
    return GraphSpec(spec.input_shape, tuple(steps), tuple(new[o] for o in spec.outputs), spec.seed)


def graphs(max_steps: int = 8, min_steps: int = 1, family: str | None = None):
    """Hypothesis strategy of :class:`GraphSpec` (see :func:`draw_graph`)."""
    from hypothesis import strategies as st

    @st.composite
    def strategy(draw):
        return draw_graph(HypothesisChooser(draw), max_steps, min_steps, family=family)

    return strategy()


def random_graph(
    seed: int, max_steps: int = 8, min_steps: int = 1, family: str | None = None
) -> GraphSpec:
    """The plain seeded builder: the same generator driven by numpy's RNG."""
    rng = np.random.default_rng([47, seed])
    return draw_graph(NumpyChooser(rng), max_steps, min_steps, seed, family)


def graph_with(
    motif: str, index: int, options: dict | None = None, max_steps: int = 8, attempts: int = 3000
) -> GraphSpec | None:
    """The first seeded graph (seeds ``index * 10_000 + k``, ``k < attempts``) holding motif
    variant ``motif``, building alive and, under ``options``, hitting no known defect
    (:func:`known_bad_graph`); None when there is none. A deterministic way to make a small
    CI sample compile every motif variant."""
    for k in range(attempts):
        spec = random_graph(index * 10_000 + k, max_steps)
        if motif not in spec.motifs():
            continue
        try:
            built = build_graph(spec)
        except DeadGraph:
            continue
        if options is None or known_bad_graph(spec, options, built.shapes) is None:
            return spec
    return None


# ---------------------------------------------------------------------------------------------
# Building: the Relax module (import style) and its numpy twin in lockstep


class DeadGraph(ValueError):
    """The graph's reference output is not finite, near zero or constant: comparing with it
    proves nothing."""


@dataclass
class Built:
    spec: GraphSpec
    mod: Any  # tvm.IRModule
    inputs: list[np.ndarray]
    expected: list[np.ndarray]  # float64, from the numpy twin
    relax_ops: set[str] = field(default_factory=set)
    shapes: list[tuple] = field(default_factory=list)  # of every value, the input first


class _Builder:
    """Emits Relax bindings with ``bb`` while computing the same values with numpy."""

    def __init__(self, bb, rng: np.random.Generator):
        self.bb = bb
        self.rng = rng
        self.ops: set[str] = set()

    def emit(self, expr):
        self.ops.add(str(expr.op.name) if hasattr(expr, "op") else type(expr).__name__)
        return self.bb.emit(expr)

    def const(self, value: np.ndarray):
        from tvm import relax

        return relax.const(np.asarray(value, dtype="float32"), "float32")

    def scalar(self, value: float):
        from tvm import relax

        return relax.const(value, "float32")

    def weight(self, shape, std: float) -> np.ndarray:
        return (std * self.rng.standard_normal(shape)).astype("float32")

    # --- elementwise ------------------------------------------------------------------------

    def act(self, name: str, x, v: np.ndarray):
        from tvm import relax

        op = relax.op
        if name == "relu":
            return self.emit(op.nn.relu(x)), np.maximum(v, 0)
        if name == "relu6":
            return self.emit(op.clip(x, 0.0, 6.0)), np.clip(v, 0, 6)
        if name == "relu6_op":
            return self.emit(op.nn.relu6(x)), np.clip(v, 0, 6)
        if name == "sigmoid":
            return self.emit(op.sigmoid(x)), _sigmoid(v)
        if name == "silu":
            s = self.emit(op.sigmoid(x))
            return self.emit(op.multiply(x, s)), v * _sigmoid(v)
        if name == "silu_op":
            return self.emit(op.nn.silu(x)), v * _sigmoid(v)
        if name == "hardswish":  # torch's hardswish as arithmetic: x * relu6(x + 3) / 6
            t = self.emit(op.add(x, self.scalar(3.0)))
            t = self.emit(op.clip(t, 0.0, 6.0))
            t = self.emit(op.divide(t, self.scalar(6.0)))
            return self.emit(op.multiply(x, t)), v * np.clip(v + 3, 0, 6) / 6
        if name == "hardsigmoid":
            t = self.emit(op.add(x, self.scalar(3.0)))
            t = self.emit(op.clip(t, 0.0, 6.0))
            return self.emit(op.divide(t, self.scalar(6.0))), np.clip(v + 3, 0, 6) / 6
        if name == "gelu":
            return self.emit(op.nn.gelu(x)), _gelu(v)
        if name == "gelu_tanh":
            return self.emit(op.nn.gelu_tanh(x)), _gelu_tanh(v)
        raise AssertionError(name)

    def channel_const(self, value: np.ndarray):
        """A per-channel constant (C,) as the importer writes it: ``expand_dims`` to
        ``(1, C, 1, 1)``."""
        from tvm import relax

        return self.emit(relax.op.expand_dims(self.const(value), axis=[0, 2, 3]))

    def batch_norm(self, x, v: np.ndarray):
        """Batch norm as ``torch.export`` imports it, statistics calibrated on ``v``."""
        from tvm import relax

        op = relax.op
        ch = v.shape[1]
        mu = v.mean(axis=(0, 2, 3))
        var = v.var(axis=(0, 2, 3))
        floor = 0.1 * float(v.var()) + 1e-2
        sd = np.sqrt(np.maximum(var, floor))
        mean = (mu + 0.1 * sd * self.rng.standard_normal(ch)).astype("float32")
        var = (np.maximum(var, floor) * self.rng.uniform(0.6, 1.6, ch)).astype("float32")
        gamma = self.rng.uniform(0.5, 1.5, ch).astype("float32")
        beta = (0.3 * self.rng.standard_normal(ch)).astype("float32")
        eps = 1e-3 if self.rng.random() < 0.5 else 1e-5
        y = self.emit(op.subtract(x, self.channel_const(mean)))
        d = self.emit(op.add(self.channel_const(var), self.scalar(eps)))
        d = self.emit(op.sqrt(d))
        y = self.emit(op.divide(y, d))
        y = self.emit(op.multiply(y, self.channel_const(gamma)))
        y = self.emit(op.add(y, self.channel_const(beta)))
        r = lambda a: a.astype(np.float64).reshape(1, ch, 1, 1)  # noqa: E731
        vv = (v - r(mean)) / np.sqrt(r(var) + np.float64(np.float32(eps))) * r(gamma) + r(beta)
        return y, vv

    def dense(self, x, v: np.ndarray, out: int, style: str, bias: bool):
        from tvm import relax

        op = relax.op
        fan_in = v.shape[-1]
        w = self.weight((out, fan_in), math.sqrt(2.0 / fan_in))
        b = self.weight((out,), 0.2) if bias else None
        if style == "linear":
            y = self.emit(op.linear(x, self.const(w), self.const(b) if bias else None))
        else:
            wt = self.emit(op.permute_dims(self.const(w))) if style == "torch" else self.const(w.T)
            y = self.emit(op.matmul(x, wt))
            if bias:
                y = self.emit(op.add(y, self.const(b)))
        vv = v @ w.T.astype(np.float64)
        if bias:
            vv = vv + b
        return y, vv

    def conv(self, x, v: np.ndarray, a: dict):
        from tvm import relax

        op = relax.op
        ch = v.shape[1]
        kh, kw = a["kernel"]
        cg = ch // a["groups"]
        w = self.weight((a["out"], cg, kh, kw), math.sqrt(2.0 / (cg * kh * kw)))
        t, left, b, r = a["pad"]
        if a["explicit_pad"]:
            x = self.emit(op.nn.pad(x, [0, 0, 0, 0, t, b, left, r], "constant", 0.0))
            padding = (0, 0, 0, 0)
        else:
            padding = (t, left, b, r)
        y = self.emit(
            op.nn.conv2d(
                x,
                self.const(w),
                strides=(a["stride"],) * 2,
                padding=padding,
                dilation=(a["dilation"],) * 2,
                groups=a["groups"],
                out_dtype="float32",
            )
        )
        vv = np_conv2d(v, w, a["stride"], a["pad"], a["dilation"], a["groups"])
        if a["bias"]:
            bias = self.weight((a["out"],), 0.2)
            y = self.emit(op.add(y, self.channel_const(bias)))
            vv = vv + bias.reshape(1, -1, 1, 1)
        if a["bn"]:
            y, vv = self.batch_norm(y, vv)
        if a["act"]:
            y, vv = self.act(a["act"], y, vv)
        return y, vv

    # --- the steps ----------------------------------------------------------------------------

    def step(self, s: Step, vals: list):
        from tvm import relax

        op = relax.op
        a = s.attrs
        x, v = vals[a["src"]]
        if s.op == "conv":
            return self.conv(x, v, a)
        if s.op == "act":
            return self.act(a["name"], x, v)
        if s.op == "bn":
            y, vv = self.batch_norm(x, v)
            return self.act(a["act"], y, vv) if a["act"] else (y, vv)
        if s.op == "pad":
            t, left, b, r = a["pad"]
            y = self.emit(op.nn.pad(x, [0, 0, 0, 0, t, b, left, r], "constant", a["value"]))
            return y, np.pad(v, ((0, 0), (0, 0), (t, b), (left, r)), constant_values=a["value"])
        if s.op == "add":
            y, w = vals[a["other"]]
            return self.emit(op.add(x, y)), v + w
        if s.op == "concat":
            y, w = vals[a["other"]]
            axis = 1 if v.ndim == 4 else v.ndim - 1
            return self.emit(op.concat([x, y], axis=axis)), np.concatenate([v, w], axis=axis)
        if s.op == "pool":
            k, st, p = a["k"], a["stride"], a["pad"]
            fn = op.nn.max_pool2d if a["kind"] == "max" else op.nn.avg_pool2d
            y = self.emit(
                fn(
                    x,
                    pool_size=(k, k),
                    strides=(st, st),
                    padding=(p, p, p, p),
                    count_include_pad=a["count_include_pad"],
                )
            )
            return y, np_pool(v, a["kind"], k, st, p, a["count_include_pad"])
        if s.op == "gpool":
            if a["mode"] == "mean":
                y = self.emit(op.mean(x, axis=[2, 3], keepdims=True))
            else:
                y = self.emit(op.nn.adaptive_avg_pool2d(x, output_size=(1, 1)))
            return y, v.mean(axis=(2, 3), keepdims=True)
        if s.op == "se":
            ch = v.shape[1]
            if a["mode"] == "mean":
                q = self.emit(op.mean(x, axis=[2, 3], keepdims=True))
            else:
                q = self.emit(op.nn.adaptive_avg_pool2d(x, output_size=(1, 1)))
            qv = v.mean(axis=(2, 3), keepdims=True)
            one = dict(
                kernel=(1, 1),
                stride=1,
                pad=(0, 0, 0, 0),
                dilation=1,
                groups=1,
                explicit_pad=False,
                bias=True,
                bn=False,
            )
            q, qv = self.conv(q, qv, {**one, "out": a["reduced"], "act": a["inner"]})
            q, qv = self.conv(q, qv, {**one, "out": ch, "act": a["gate"]})
            return self.emit(op.multiply(x, q)), v * qv
        if s.op == "shuffle":
            n, ch, h, w = v.shape
            g = a["groups"]
            y = self.emit(op.reshape(x, (n, g, ch // g, h, w)))
            y = self.emit(op.permute_dims(y, [0, 2, 1, 3, 4]))
            y = self.emit(op.reshape(y, (n, ch, h, w)))
            vv = v.reshape(n, g, ch // g, h, w).transpose(0, 2, 1, 3, 4).reshape(n, ch, h, w)
            return y, vv
        if s.op == "cl_block":  # ConvNeXt: channels last, layer norm (and MLP), back
            y = self.emit(op.permute_dims(x, [0, 2, 3, 1]))
            vv = v.transpose(0, 2, 3, 1)
            y, vv = self.layer_norm(y, vv, 1e-6)
            if a["mlp"]:
                y, vv = self.dense(y, vv, a["mlp"], "torch", True)
                y, vv = self.act(a["act"], y, vv)
            return self.emit(op.permute_dims(y, [0, 3, 1, 2])), vv.transpose(0, 3, 1, 2)
        if s.op == "to_tokens":
            n, ch, h, w = v.shape
            if a["mode"] == "tokens":
                y = self.emit(op.reshape(x, (n, ch, h * w)))
                y = self.emit(op.permute_dims(y, [0, 2, 1]))
                return y, v.reshape(n, ch, h * w).transpose(0, 2, 1)
            return self.emit(op.reshape(x, (n, ch * h * w))), v.reshape(n, ch * h * w)
        if s.op == "softmax":
            return self.emit(op.nn.softmax(x, axis=a["axis"])), _softmax(v, a["axis"])
        if s.op == "dense":
            y, vv = self.dense(x, v, a["out"], a["style"], a["bias"])
            return self.act(a["act"], y, vv) if a["act"] else (y, vv)
        if s.op == "layer_norm":
            return self.layer_norm(x, v, a["eps"])
        if s.op == "attention":
            return self.attention(x, v, a)
        if s.op == "transpose":
            return self.emit(op.permute_dims(x, [0, 2, 1])), v.transpose(0, 2, 1)
        if s.op == "reshape":
            n = v.shape[0]
            d = a["features"]
            shape = (n, v.size // n // d, d)
            return self.emit(op.reshape(x, shape)), v.reshape(shape)
        if s.op == "bmm":
            y, w = vals[a["other"]]
            yt = self.emit(op.permute_dims(y, [0, 2, 1]))
            return self.emit(op.matmul(x, yt)), v @ w.transpose(0, 2, 1)
        if s.op == "token_pool":
            return self.emit(op.mean(x, axis=[1])), v.mean(axis=1)
        raise AssertionError(s.op)

    def layer_norm(self, x, v: np.ndarray, eps: float):
        from tvm import relax

        d = v.shape[-1]
        gamma = self.rng.uniform(0.5, 1.5, d).astype("float32")
        beta = (0.2 * self.rng.standard_normal(d)).astype("float32")
        y = self.emit(
            relax.op.nn.layer_norm(x, self.const(gamma), self.const(beta), axes=[-1], epsilon=eps)
        )
        mu = v.mean(axis=-1, keepdims=True)
        var = v.var(axis=-1, keepdims=True)
        return y, (v - mu) / np.sqrt(var + np.float64(np.float32(eps))) * gamma + beta

    def attention(self, x, v: np.ndarray, a: dict):
        from tvm import relax

        op = relax.op
        b, s, d = v.shape
        h = a["heads"]
        dh = d // h
        heads = []
        for _ in range(3):
            y, vv = self.dense(x, v, d, "torch", True)
            y = self.emit(op.reshape(y, (b, s, h, dh)))
            heads.append(
                (
                    self.emit(op.permute_dims(y, [0, 2, 1, 3])),
                    vv.reshape(b, s, h, dh).transpose(0, 2, 1, 3),
                )
            )
        (q, qv), (k, kv), (vx, vv) = heads
        kt = self.emit(op.permute_dims(k, [0, 1, 3, 2]))
        scores = self.emit(op.matmul(q, kt))
        sv = qv @ kv.transpose(0, 1, 3, 2)
        if a["scale"] == "multiply":
            scale = np.float32(1.0 / math.sqrt(dh))
            scores = self.emit(op.multiply(scores, self.scalar(float(scale))))
            sv = sv * np.float64(scale)
        else:
            scale = np.float32(math.sqrt(dh))
            scores = self.emit(op.divide(scores, self.scalar(float(scale))))
            sv = sv / np.float64(scale)
        p = self.emit(op.nn.softmax(scores, axis=-1))
        pv = _softmax(sv, -1)
        o = self.emit(op.matmul(p, vx))
        o = self.emit(op.permute_dims(o, [0, 2, 1, 3]))
        o = self.emit(op.reshape(o, (b, s, d)))
        ov = (pv @ vv).transpose(0, 2, 1, 3).reshape(b, s, d)
        if a["proj"]:
            return self.dense(o, ov, d, "torch", True)
        return o, ov


def build_graph(spec: GraphSpec, check_alive: bool = True) -> Built:
    """The Relax module of ``spec`` (``main`` takes the input, returns a tuple of the
    outputs), its input values and the numpy twin's outputs.

    Raises :class:`DeadGraph` (unless ``check_alive`` is False) when an expected output is
    not finite, has no element above 1e-3 in magnitude, or (several elements) is constant.
    """
    from tvm import relax

    x_np = np.random.default_rng([spec.seed, 0]).standard_normal(spec.input_shape)
    x_np = x_np.astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(spec.input_shape, "float32"))
    builder = _Builder(bb, None)
    with bb.function("main", [x]):
        with bb.dataflow():
            vals = [(x, x_np.astype(np.float64))]
            for i, step in enumerate(spec.steps):
                builder.rng = np.random.default_rng([spec.seed, i + 1])
                y, v = builder.step(step, vals)
                assert tuple(int(d) for d in y.ty.shape) == v.shape, (step, y.ty, v.shape)
                vals.append((y, v))
            gv = bb.emit_output(relax.Tuple([vals[i][0] for i in spec.outputs]))
        bb.emit_func_output(gv)
    expected = [vals[i][1] for i in spec.outputs]
    if check_alive:
        for i, e in zip(spec.outputs, expected, strict=True):
            why = dead_reason(e)
            if why:
                raise DeadGraph(f"value {i}: {why}")
    return Built(spec, bb.get(), [x_np], expected, builder.ops, [v.shape for _, v in vals])


def dead_reason(value: np.ndarray) -> str | None:
    """Why ``value`` makes a worthless reference (None when it is fine)."""
    if not np.all(np.isfinite(value)):
        return "not finite"
    peak = float(np.abs(value).max()) if value.size else 0.0
    if peak < 1e-3:
        return f"near zero (max |v| = {peak:.3g})"
    if value.size > 1 and float(np.ptp(value)) < 1e-6 * peak:
        return "constant"
    return None


# ---------------------------------------------------------------------------------------------
# numpy operators (float64)


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _gelu(v):
    from scipy.special import erf

    return 0.5 * v * (1.0 + erf(v / math.sqrt(2.0)))


def _gelu_tanh(v):
    return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))


def _softmax(v, axis):
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_conv2d(x, w, stride: int, pad, dilation: int, groups: int) -> np.ndarray:
    """NCHW / OIHW convolution; ``pad`` is ``(top, left, bottom, right)``."""
    t, left, b, r = pad
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (left, r)))
    n, _, hp, wp = xp.shape
    o, cg, kh, kw = w.shape
    oh = (hp - dilation * (kh - 1) - 1) // stride + 1
    ow = (wp - dilation * (kw - 1) - 1) // stride + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    w = w.astype(np.float64)
    for g in range(groups):
        xs = xp[:, g * cg : (g + 1) * cg]
        ws = w[g * og : (g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xs[
                    :,
                    :,
                    i * dilation : i * dilation + stride * (oh - 1) + 1 : stride,
                    j * dilation : j * dilation + stride * (ow - 1) + 1 : stride,
                ]
                out[:, g * og : (g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


def np_pool(x, kind: str, k: int, stride: int, pad: int, count_include_pad: bool) -> np.ndarray:
    """Max or average pooling, symmetric padding, floor mode (Relax's ``ceil_mode=False``)."""
    n, c, h, w = x.shape
    spec = ((0, 0), (0, 0), (pad, pad), (pad, pad))
    xp = np.pad(x, spec, constant_values=-np.inf if kind == "max" else 0.0)
    valid = np.pad(np.ones((h, w)), spec[2:])
    oh = (h + 2 * pad - k) // stride + 1
    ow = (w + 2 * pad - k) // stride + 1
    windows = [
        (
            xp[
                :, :, i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride
            ],
            valid[i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride],
        )
        for i in range(k)
        for j in range(k)
    ]
    if kind == "max":
        return np.max([win for win, _ in windows], axis=0)
    total = np.sum([win for win, _ in windows], axis=0)
    count = k * k if count_include_pad else np.sum([m for _, m in windows], axis=0)
    return total / count


# ---------------------------------------------------------------------------------------------
# Running and comparing

TOLERANCE = 1e-4


def tvm_reference(mod, inputs: list[np.ndarray], target=FAST_TARGET) -> list[np.ndarray]:
    """The outputs of TVM's own build of ``mod`` (``tvm.compile`` + Relax VM)."""
    import tvm

    ex = tvm.compile(mod, tvm.target.Target(target))
    return run_vm(ex, inputs, calls=1)[0]


def run_vm(ex, inputs: list[np.ndarray], calls: int = 2) -> list[list[np.ndarray]]:
    """``main`` of ``ex`` called ``calls`` times on one VM, each call's outputs as numpy (a
    kernel that reads memory nobody wrote may depend on what the previous call left)."""
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(x) for x in inputs]
    results = []
    for _ in range(calls):
        out = vm["main"](*args)
        outs = [out] if hasattr(out, "numpy") else list(out)
        results.append([o.numpy() for o in outs])
    return results


def mismatch(got: np.ndarray, want: np.ndarray, tolerance: float = TOLERANCE) -> str | None:
    """None when ``got`` is within ``tolerance`` of ``want`` relative to ``want``'s largest
    magnitude (elementwise: ``|got - want| <= tol * (peak + |want|)``); else what differs and
    where (NaN count, worst error, the bad rows/columns of an image, so that a wrong border
    shows as one)."""
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    want = want.astype(np.float64)
    peak = float(np.abs(want).max())
    err = np.abs(got.astype(np.float64) - want)
    bad = ~(err <= tolerance * (peak + np.abs(want)))  # NaN is bad
    if not bad.any():
        return None
    where = np.argwhere(bad)
    msg = (
        f"{int(bad.sum())} of {bad.size} elements off ({int(np.isnan(got).sum())} NaN), "
        f"worst relative error {float(np.nanmax(np.where(bad, err, 0))) / max(peak, 1e-30):.3g}, "
        f"first at {tuple(int(i) for i in where[0])}"
    )
    if got.ndim == 4:
        rows = sorted({int(i) for i in where[:, 2]})
        cols = sorted({int(i) for i in where[:, 3]})
        msg += f"; rows {rows} of {got.shape[2]}, columns {cols} of {got.shape[3]}"
    return msg


@dataclass
class Outcome:
    """What :func:`check_graph` found; ``problems`` empty when tvm-rtask matched."""

    spec: GraphSpec
    options: dict
    target: Any
    problems: list[str]
    reference_problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems and not self.reference_problems

    def report(self) -> str:
        lines = [f"options={self.options!r} target={self.target!r}", repr(self.spec)]
        lines += [f"reference: {p}" for p in self.reference_problems]
        lines += [f"tvm-rtask: {p}" for p in self.problems]
        return "\n".join(lines)


def check_graph(
    spec: GraphSpec,
    options: dict,
    target=FAST_TARGET,
    built: Built | None = None,
    reference: list[np.ndarray] | None = None,
    calls: int = 2,
) -> Outcome:
    """Compile ``spec`` with ``tvm_rtask.compile(mod, target, **compile_options(options))``,
    run it ``calls`` times and compare each output with TVM's build (``reference``, computed
    when not given) and that build with the numpy twin."""
    import tvm_rtask

    built = built if built is not None else build_graph(spec)
    if reference is None:
        reference = tvm_reference(built.mod, built.inputs, target)
    ref_problems = []
    for i, (r, e) in enumerate(zip(reference, built.expected, strict=True)):
        m = mismatch(r, e)
        if m:
            ref_problems.append(f"TVM's build vs numpy, output {i}: {m}")
    problems = []
    try:
        ex = tvm_rtask.compile(built.mod, target, **compile_options(options))
        runs = run_vm(ex, built.inputs, calls)
    except Exception as err:  # a compile or run failure is a finding too
        problems.append(f"{type(err).__name__}: {str(err)[:2000]}")
        runs = []
    for call, outs in enumerate(runs):
        if len(outs) != len(reference):
            problems.append(f"call {call}: {len(outs)} outputs, expected {len(reference)}")
            continue
        for i, (got, want) in enumerate(zip(outs, reference, strict=True)):
            m = mismatch(got, want)
            if m:
                problems.append(f"call {call}, output {i}: {m}")
    return Outcome(spec, dict(options), target, problems, ref_problems)


# ---------------------------------------------------------------------------------------------
# A campaign without shrinking: every failure of a range of seeded graphs


def campaign(
    start: int,
    count: int,
    max_steps: int = 8,
    full_every: int = 5,
    skip_known: bool = True,
    out=None,
) -> int:
    """Check the seeded graphs ``start .. start + count - 1``, graph ``s`` under sweep row
    ``s % len(option_sweep())`` (the optimised build every ``full_every``-th graph, -O0
    otherwise); print each failure's report and return how many failed. Unlike hypothesis it
    does not stop at the first failure nor shrink: it tells which defects a range of graphs
    hits, each then reduced by hand or by the hypothesis tests. Graphs that hit a known
    defect (:func:`known_bad_graph`) are skipped unless ``skip_known`` is False."""
    import sys

    out = out or sys.stdout
    sweep = option_sweep()
    failed = checked = skipped = 0
    for s in range(start, start + count):
        spec = random_graph(s, max_steps)
        options = sweep[s % len(sweep)]
        try:
            built = build_graph(spec)
        except DeadGraph:
            continue
        if skip_known and known_bad_graph(spec, options, built.shapes):
            skipped += 1
            continue
        checked += 1
        target = FULL_TARGET if s % full_every == 0 else FAST_TARGET
        outcome = check_graph(spec, options, target, built=built)
        if not outcome.ok:
            failed += 1
            print(f"--- seed {s}: FAILED\n{outcome.report()}\n", file=out, flush=True)
    print(
        f"{checked} graphs checked, {failed} failed, {skipped} skipped (known defects)",
        file=out,
        flush=True,
    )
    return failed


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=campaign.__doc__)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--all", action="store_true", help="do not skip known defects")
    args = parser.parse_args(argv)
    return 1 if campaign(args.start, args.count, args.max_steps, skip_known=not args.all) else 0


if __name__ == "__main__":
    raise SystemExit(main())
