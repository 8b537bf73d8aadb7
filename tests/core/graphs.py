"""Graph builders and hypothesis strategies shared by the core and schedule tests."""

from __future__ import annotations

from hypothesis import strategies as st

from tvm_rtask.core import RGraph, RKernel, ROperator


def op(
    name: str,
    inputs: list[str],
    rtasks: int | list[int] = 2,
    flops: float = 1e6,
    nbytes: float = 1e4,
    supported: bool = True,
) -> ROperator:
    """Operator ``name`` writing tensor ``name`` and reading ``inputs``."""
    counts = [rtasks] if isinstance(rtasks, int) else rtasks
    kernels = [RKernel(f"{name}@{n}", n) for n in counts] if supported else []
    return ROperator(
        name,
        func=f"f_{name}",
        inputs=list(inputs),
        outputs=[name],
        flops=flops,
        bytes=nbytes,
        rkernels=kernels,
        supported=supported,
        reason="" if supported else "extern call",
    )


def chain(n: int, rtasks: int = 2) -> RGraph:
    return RGraph(op(f"op{i}", [f"op{i - 1}" if i else "x"], rtasks) for i in range(n))


def diamond(rtasks: int = 2) -> RGraph:
    return RGraph(
        [
            op("a", ["x"], rtasks),
            op("b", ["a"], rtasks),
            op("c", ["a"], rtasks),
            op("d", ["b", "c"], rtasks),
        ]
    )


def inception(rtasks: int = 2) -> RGraph:
    """One input, 4 parallel branches of 1-2 ops, a concat."""
    return RGraph(
        [
            op("stem", ["x"], rtasks),
            op("b1", ["stem"], rtasks),
            op("b2a", ["stem"], rtasks),
            op("b2b", ["b2a"], rtasks),
            op("b3a", ["stem"], rtasks),
            op("b3b", ["b3a"], rtasks),
            op("b4", ["stem"], rtasks),
            op("concat", ["b1", "b2b", "b3b", "b4"], rtasks),
        ]
    )


def _ops_from_edges(draw, n: int, edges: list[tuple[int, int]]) -> list[ROperator]:
    preds: list[list[int]] = [[] for _ in range(n)]
    for i, j in edges:
        preds[j].append(i)
    ops = []
    for j in range(n):
        supported = draw(st.integers(0, 9)) > 0  # about one op in ten stays ordinary
        counts = draw(st.lists(st.integers(1, 8), min_size=1, max_size=2, unique=True))
        ops.append(
            op(
                f"n{j}",
                [f"n{i}" for i in sorted(preds[j])] or ["x"],
                counts,
                flops=float(draw(st.sampled_from([0, 1e5, 1e6, 3e7]))),
                nbytes=float(draw(st.sampled_from([0, 1e3, 1e5, 4e6]))),
                supported=supported,
            )
        )
    order = draw(st.permutations(range(n)))  # the graph must sort a non-topological order
    return [ops[k] for k in order]


@st.composite
def small_dags(draw, max_ops: int = 9, max_edges: int = 7) -> RGraph:
    n = draw(st.integers(1, max_ops))
    pairs = [(i, j) for j in range(n) for i in range(j)]
    edges = draw(st.lists(st.sampled_from(pairs), max_size=max_edges, unique=True)) if pairs else []
    return RGraph(_ops_from_edges(draw, n, edges))


@st.composite
def layered_dags(draw, max_layers: int = 8, max_width: int = 8) -> RGraph:
    widths = draw(st.lists(st.integers(1, max_width), min_size=1, max_size=max_layers))
    layers: list[list[int]] = []
    k = 0
    for w in widths:
        layers.append(list(range(k, k + w)))
        k += w
    edges: list[tuple[int, int]] = []
    for li in range(1, len(layers)):
        earlier = [i for layer in layers[max(0, li - 2) : li] for i in layer]
        for j in layers[li]:
            srcs = draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=3, unique=True))
            edges += [(i, j) for i in srcs]
    return RGraph(_ops_from_edges(draw, k, edges))
