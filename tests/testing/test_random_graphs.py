"""Differential fuzzing: random CNN / transformer graphs, tvm-rtask against TVM's own build.

The generator, the references and the option sweep are ``tvm_rtask.testing.random_graphs``
(its docstring says what is drawn and why). Here:

- checks of the generator itself (no compile): every motif variant is drawn, graphs build
  alive, the option sweep covers every value and every pair of values of every option;
- ``test_option_sweep_graph``: one compile per row of the pairwise option sweep, each on a
  seeded graph made to hold a given motif variant, so a CI run covers every option value
  and every motif variant at least once;
- ``test_fuzz_*``: hypothesis draws graph and options together (``derandomize=True``: the
  same examples in every CI run), image, token and longer mixed graphs in separate tests so
  that pytest-xdist spreads them; a graph that hits a defect already reported
  (``rg.known_bad_graph``) is skipped, its regression entry stands for it;
- ``test_regression``: the failures found so far (``regressions_random_graphs.py``);
- ``test_fuzz_many`` (slow): thousands of graphs of up to 12 motifs, ``RTASK_FUZZ_EXAMPLES``
  (default 5000, about a second each) and ``RTASK_FUZZ_SEED`` (default: a random seed,
  printed with the failure's ``@reproduce_failure`` blob); one test, so one core: run two
  seeds side by side on two cores::

      RTASK_FUZZ_EXAMPLES=5000 RTASK_FUZZ_SEED=1 .venv/bin/python -m pytest -q -m slow \\
          -p no:cacheprovider tests/testing/test_random_graphs.py -k test_fuzz_many

  Its time limit is 5 s per example (pytest-timeout; the suite's 900 s would stop it).
  ``python -m tvm_rtask.testing.random_graphs --start 0 --count 1000`` is the campaign
  without hypothesis: every failure of a range of seeded graphs, no shrinking.

Every compile gets ``nan_fill=True`` where tvm-rtask has that option, and every compiled
function is called twice.
"""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, assume, given, note, seed, settings
from hypothesis import strategies as st

from tvm_rtask.testing import random_graphs as rg

from .regressions_random_graphs import REGRESSIONS

CI_SETTINGS = dict(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)
# examples per hypothesis test in CI (three tests)
CI_EXAMPLES = 25
# every fifth CI graph is built with LLVM's optimisations, the others at -O0 (faster)
TARGETS = st.sampled_from([rg.FAST_TARGET] * 4 + [rg.FULL_TARGET])


def _check(spec: rg.GraphSpec, options: dict, target) -> None:
    try:
        built = rg.build_graph(spec)
    except rg.DeadGraph:
        assume(False)
        return
    # a defect already reported (and kept in regressions_random_graphs.py) is not found again
    assume(rg.known_bad_graph(spec, options, built.shapes) is None)
    outcome = rg.check_graph(spec, options, target, built=built)
    if not outcome.ok:
        note(built.mod["main"].script(show_meta=False))
    assert not outcome.reference_problems, outcome.report()
    assert outcome.ok, outcome.report()


# --- the generator --------------------------------------------------------------------------

SAMPLE = [rg.random_graph(s) for s in range(400)]

EVERY_VARIANT = {
    *rg.MOTIFS,
    *(f"act:{a}" for a in rg.ACTIVATIONS),
    "bn",
    "conv:dense",
    "conv:depthwise",
    "conv:grouped",
    "conv:1x1",
    "conv:kxk",
    "conv:kh!=kw",
    "conv:strided",
    "conv:dilated",
    "conv:bias",
    "conv:explicit_pad",
    "conv:pad_same",
    "conv:pad_none",
    "conv:pad_tf_same",
    "conv:pad_asym",
    "pad:bottom_right_only",
    "pad:symmetric",
    "pad:asymmetric",
    "pool:max",
    "pool:avg",
    "gpool:mean",
    "gpool:adaptive",
    "se:sigmoid",
    "se:hardsigmoid",
    "se:mean",
    "se:adaptive",
    "to_tokens:tokens",
    "to_tokens:flatten",
    "cl_block:mlp",
    "dense:torch",
    "dense:linear",
    "dense:matmul",
    "attention:multiply",
    "attention:divide",
    *(f"block:{b}" for b in rg.BLOCKS),
}


def test_generator_draws_every_motif_variant():
    drawn = set().union(*(g.motifs() for g in SAMPLE))
    assert EVERY_VARIANT <= drawn, sorted(EVERY_VARIANT - drawn)
    assert drawn <= EVERY_VARIANT, sorted(drawn - EVERY_VARIANT)


def test_generator_graphs_build_alive_in_import_style():
    dead = 0
    relax_ops = set()
    for spec in SAMPLE[:150]:
        try:
            built = rg.build_graph(spec)
        except rg.DeadGraph:
            dead += 1
            continue
        relax_ops |= built.relax_ops
        for out in built.expected:
            assert rg.dead_reason(out) is None
    assert dead <= 5
    # batch norm as arithmetic, gates, the reshapes and transposes of attention and shuffle
    for name in (
        "relax.nn.conv2d",
        "relax.nn.pad",
        "relax.expand_dims",
        "relax.subtract",
        "relax.sqrt",
        "relax.divide",
        "relax.sigmoid",
        "relax.clip",
        "relax.nn.gelu",
        "relax.nn.softmax",
        "relax.nn.layer_norm",
        "relax.matmul",
        "relax.permute_dims",
        "relax.reshape",
        "relax.concat",
        "relax.mean",
        "relax.nn.max_pool2d",
        "relax.nn.avg_pool2d",
        "relax.nn.adaptive_avg_pool2d",
    ):
        assert name in relax_ops, name


def test_the_known_pad_pattern_can_be_drawn():
    """conv + batch norm + SiLU, then a bottom/right-only pad read by a stride-2 conv
    (nan_fragment.json): drawn by the seeded builder, so hypothesis can draw it too."""

    def has_pattern(g: rg.GraphSpec) -> bool:
        for i, s in enumerate(g.steps):
            if s.op != "conv" or not s["bn"] or s["act"] not in ("silu", "silu_op"):
                continue
            for j, p in enumerate(g.steps):
                if p.op == "pad" and p["src"] == i + 1 and p["pad"][:2] == (0, 0):
                    if any(
                        c.op == "conv" and c["src"] == j + 1 and c["stride"] == 2 for c in g.steps
                    ):
                        return True
        return False

    assert any(has_pattern(rg.random_graph(s)) for s in range(3000))


def test_hypothesis_draws_well_formed_graphs():
    @given(graph=rg.graphs())
    @settings(max_examples=50, **CI_SETTINGS)
    def draws(graph):
        assert len(graph.steps) >= 1
        assert graph.outputs[0] == len(graph.steps)
        assert all(s.get("src", 0) <= i for i, s in enumerate(graph.steps))

    draws()


def test_numpy_operators_against_known_values():
    import numpy as np

    x = np.arange(16.0).reshape(1, 1, 4, 4)
    w = np.ones((1, 1, 2, 2))
    assert rg.np_conv2d(x, w, 2, (0, 0, 0, 0), 1, 1).ravel().tolist() == [10, 18, 42, 50]
    # bottom/right zero padding reaches the last row and column
    assert rg.np_conv2d(x, w, 2, (0, 0, 1, 1), 1, 1).shape == (1, 1, 2, 2)
    assert rg.np_pool(x, "max", 2, 2, 0, False).ravel().tolist() == [5, 7, 13, 15]
    # count_include_pad=False averages only the real elements of a corner window
    assert rg.np_pool(x, "avg", 2, 2, 1, False)[0, 0, 0, 0] == 0.0
    assert rg.np_pool(x, "avg", 2, 2, 1, False)[0, 0, 2, 2] == 15.0
    assert rg.np_pool(x, "avg", 2, 2, 1, True)[0, 0, 2, 2] == 15.0 / 4
    assert rg.dead_reason(np.zeros(4)) and rg.dead_reason(np.ones(4))
    assert rg.dead_reason(np.array([np.nan, 1.0])) and rg.dead_reason(np.arange(4.0)) is None


# --- options --------------------------------------------------------------------------------


def test_option_sweep_covers_every_value_and_pair():
    space = rg.option_space()
    sweep = rg.option_sweep()
    # every pair of values of the two largest options needs a row of its own: the least a
    # pairwise sweep can be; the greedy one stays within two rows of it
    sizes = sorted(len(values) for values in space.values())
    assert len(sweep) <= sizes[-1] * sizes[-2] + 2
    assert all(rg.known_bad(row) is None for row in sweep)
    for (a, va), (b, vb) in itertools.combinations(space.items(), 2):
        for x, y in itertools.product(va, vb):
            if rg.known_bad({a: x, b: y}):
                continue
            assert any(row[a] == x and row[b] == y for row in sweep), (a, x, b, y)
    assert set(space["policy"]) == set(rg.policy_names())


def test_nan_fill_is_passed_when_it_exists():
    from tvm_rtask.options import RTaskOptions

    opts = rg.compile_options({"policy": "sequential"})
    assert opts.get("nan_fill", False) is ("nan_fill" in RTaskOptions.__dataclass_fields__)


# --- compiled graphs ------------------------------------------------------------------------

SWEEP = rg.option_sweep()
# the motif variants dealt out to the sweep rows: row i compiles a seeded graph holding each
# of variants i, i + len(SWEEP), ..., so every variant is compiled under some row
_VARIANTS = sorted(EVERY_VARIANT)


@pytest.mark.parametrize("index", range(len(SWEEP)))
def test_option_sweep_graph(index):
    """Row ``index`` of the sweep compiles a graph holding each of its motif variants; a
    variant no graph can hold under the row's options without a known defect goes to the
    next row that can."""
    failures = []
    for j, motif in enumerate(_VARIANTS[index :: len(SWEEP)]):
        for shift in range(len(SWEEP)):
            k = (index + shift) % len(SWEEP)
            spec = rg.graph_with(motif, index * 10 + j, SWEEP[k])
            if spec is not None:
                break
        assert spec is not None, motif
        target = rg.FULL_TARGET if k % 5 == 0 else rg.FAST_TARGET
        outcome = rg.check_graph(spec, SWEEP[k], target)
        if not outcome.ok:
            failures.append(f"[{motif}] {outcome.report()}")
    assert not failures, "\n\n".join(failures)


@given(graph=rg.graphs(family="image"), options=rg.fuzz_options(), target=TARGETS)
@settings(max_examples=CI_EXAMPLES, **CI_SETTINGS)
def test_fuzz_image_graphs(graph, options, target):
    _check(graph, options, target)


@given(graph=rg.graphs(family="tokens"), options=rg.fuzz_options(), target=TARGETS)
@settings(max_examples=CI_EXAMPLES, **CI_SETTINGS)
def test_fuzz_token_graphs(graph, options, target):
    _check(graph, options, target)


@given(graph=rg.graphs(max_steps=10, min_steps=3), options=rg.fuzz_options(), target=TARGETS)
@settings(max_examples=CI_EXAMPLES, **CI_SETTINGS)
def test_fuzz_longer_graphs(graph, options, target):
    _check(graph, options, target)


@pytest.mark.parametrize("case", REGRESSIONS, ids=[r.name for r in REGRESSIONS])
def test_regression(case):
    outcome = rg.check_graph(case.spec, case.options, case.target)
    if case.xfail:
        if outcome.ok:
            pytest.fail(f"fixed? {case.name} passes now: drop its xfail ({case.xfail})")
        pytest.xfail(case.xfail)
    assert not outcome.reference_problems, outcome.report()
    assert outcome.ok, outcome.report()


# --- the long run ---------------------------------------------------------------------------

FUZZ_EXAMPLES = int(os.environ.get("RTASK_FUZZ_EXAMPLES", "5000"))
_FUZZ_SEED = os.environ.get("RTASK_FUZZ_SEED")
_seeded = seed(int(_FUZZ_SEED)) if _FUZZ_SEED else (lambda f: f)


@pytest.mark.slow
@pytest.mark.timeout(max(900, 5 * FUZZ_EXAMPLES))
@_seeded
@given(graph=rg.graphs(max_steps=12), options=rg.fuzz_options(), target=TARGETS)
@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
)
def test_fuzz_many(graph, options, target):
    _check(graph, options, target)
