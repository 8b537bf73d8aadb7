"""3x3 convolutions in channel blocks as Winograd convolutions (CPU).

A direct 3x3 convolution does 9 multiply-adds per output and input channel; it already runs
near the FMA units' peak (``Conv2dPackedNCHW``: about 108 GFLOP/s a core on znver4, as fast
as ONNX Runtime and OpenVINO, which run these layers directly too). Winograd's minimal
filtering ``F(m x m, 3 x 3)`` computes an ``m x m`` tile of outputs from an ``(m+2) x (m+2)``
tile of inputs with ``(m+2)^2`` multiplications per channel pair instead of ``9 m^2``:

    V[e, u, tile, c]  = (B^T d B)[e, u]               input transform, per input channel
    M[e, u, tile, f]  = sum_c V[e, u, tile, c] U[e, u, c, f]     (m+2)^2 small GEMMs
    Y[tile, f]        = (A^T M A)                     output transform, per output channel

with ``U = G g G^T``, the weight transform, computed once here at compile time (numpy, in
float64). ``F(4x4, 3x3)`` does 4x fewer multiplications on whole tiles, ``F(2x2, 3x3)`` 2.25x.
The matrices ``A``, ``B``, ``G`` are TVM's (``topi.nn.winograd_util``: Cook-Toom with the
interpolation points of Barabasz et al., whose error is the smallest known for each size).
The transforms are written out as sums of the non-zero coefficients only, one expression per
tile position, selected by the position (constant once the schedule unrolls it).

Costs that decide where it pays (alone, 1 thread, znver4, against ``Conv2dPackedNCHW``):

- the transformed weights are ``(m+2)^2 / 9`` times the weights (4x for ``F(4, 3)``) and each
  is read once per tile: on a 7x7 map (four 4x4 tiles) ``512 -> 512`` streams 38 MB and ran
  1.28 ms against 1.28 ms for ``F(2, 3)`` (16 tiles) and 2.2 ms direct;
- maps of whole tiles gain most: ``64 -> 64`` at 56x56 2.15 -> 0.72 ms, ``128 -> 128`` at 28x28
  2.06 -> 0.70, ``256 -> 256`` at 14x14 2.08 -> 0.77 (``F(4, 3)``).

So :func:`winograd_tile` takes ``F(4, 3)`` where it makes at least :data:`MIN_TILES` tiles and
``F(2, 3)`` where only that does. Outputs differ from the direct convolution's by rounding:
relative to the output's largest value, 2.5e-6 to 7e-6 for ``F(4, 3)`` and under 1e-6 for
``F(2, 3)`` on those layers (random weights scaled to keep activations of order one).
"""

from __future__ import annotations

from functools import cache

import numpy as np
from tvm import te, tirx, topi

WINOGRAD_NAME = "conv2d_winograd_nchwc"
INPUT_ROWS_NAME = "winograd_input_rows"
INPUT_NAME = "winograd_input"
GEMM_NAME = "winograd_gemm"
OUTPUT_ROWS_NAME = "winograd_output_rows"
# the tile sizes tried, largest first: F(4x4, 3x3), then F(2x2, 3x3)
TILE_SIZES = (4, 2)
# a size is taken where the output map makes at least this many tiles: each transformed
# weight is read once per tile (7x7 in 4x4 tiles: 4 reads of 4x the weights, memory-bound)
MIN_TILES = 16
KERNEL = 3


@cache
def winograd_matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(A, B, G)`` of ``F(m x m, 3 x 3)`` in float64: ``A`` is ``(m+2, m)``, ``B``
    ``(m+2, m+2)``, ``G`` ``(m+2, 3)``, as ``topi.nn.winograd_util`` computes them."""
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    a, b, g = _cook_toom_convolution(_interpolation_points(m + KERNEL - 2), m, KERNEL)
    return (np.asarray(a, np.float64), np.asarray(b, np.float64), np.asarray(g, np.float64))


def winograd_tile(out_h: int, out_w: int) -> int | None:
    """The output tile ``m`` of a 3x3 convolution writing an ``out_h x out_w`` map: the
    largest of :data:`TILE_SIZES` that makes :data:`MIN_TILES` tiles, or None."""
    for m in TILE_SIZES:
        if -(-out_h // m) * -(-out_w // m) >= MIN_TILES:
            return m
    return None


def winograd_weights(weight: np.ndarray, m: int, lanes: int) -> np.ndarray:
    """``U[e, u, f // lanes, c, f % lanes]``: the transformed weights ``G g G^T`` of an OIHW
    ``weight`` (``3x3``, output channels a multiple of ``lanes``) in panels of ``lanes``
    output channels, so that one ``(e, u, c)`` step of the GEMM loads whole vectors."""
    _, _, g = winograd_matrices(m)
    out_channels, in_channels = weight.shape[:2]
    alpha = m + KERNEL - 1
    # one float32 GEMM over every (f, c): ``G g G^T`` is ``kron(G, G)`` times the flattened
    # 3x3 window (the two tensordots in float64 took 0.5 s of ResNet-18's compile)
    kron = np.kron(g, g).astype(np.float32)  # [(e, u), (i, j)]
    u = weight.astype(np.float32).reshape(out_channels * in_channels, KERNEL * KERNEL) @ kron.T
    u = u.reshape(out_channels // lanes, lanes, in_channels, alpha, alpha)
    return np.ascontiguousarray(u.transpose(3, 4, 0, 2, 1))


def _linear_combination(terms) -> tirx.PrimExpr:
    """``sum(coefficient * value)`` over the non-zero coefficients (1 and -1 without a
    multiplication)."""
    expr = None
    for coefficient, value in terms:
        if coefficient == 0:
            continue
        if coefficient == 1:
            term = value
        elif coefficient == -1:
            term = -value
        else:
            term = value * tirx.const(float(coefficient), "float32")
        expr = term if expr is None else expr + term
    return tirx.const(0.0, "float32") if expr is None else expr


def _by_position(i, values: list[tirx.PrimExpr]) -> tirx.PrimExpr:
    """The value of position ``i`` (a loop variable the schedule unrolls into a constant,
    so the chain folds to one expression)."""
    out = tirx.const(0.0, "float32")
    for a in reversed(range(len(values))):
        out = tirx.Select(i == a, values[a], out)
    return out


def conv2d_winograd_nchwc(x: te.Tensor, u: te.Tensor, padding, m: int) -> te.Tensor:
    """A 3x3 stride-1 convolution of ``x`` (``NCHW{b}c``) with transformed weights ``u``
    (:func:`winograd_weights`), four-sided ``padding``, output in ``NCHW{lanes}c``: the input
    transform, the GEMMs and the output transform (module docstring), each transform as two
    one-dimensional passes (``B^T d``, then ``(B^T d) B``): a sixth of the terms of the
    two-dimensional sums, and a sixth of the code for LLVM to compile."""
    n, in_blocks, height, width, in_block = (int(d) for d in x.shape)
    alpha, _, out_blocks, channels, lanes = (int(d) for d in u.shape)
    a, b, _ = winograd_matrices(m)
    top, left, bottom, right = padding
    out_h, out_w = height + top + bottom - 2, width + left + right - 2
    tiles_h, tiles_w = -(-out_h // m), -(-out_w // m)
    # padded to whole tiles at the bottom and right (those outputs are never written)
    padded = topi.nn.pad(
        x,
        [0, 0, top, left, 0],
        [0, 0, tiles_h * m + 2 - height - top, tiles_w * m + 2 - width - left, 0],
        name="pad_temp",
    )
    tile_shape = (n, tiles_h, tiles_w, in_blocks * in_block)

    def input_rows(e, s, b_, ty, tx, c):  # (B^T d)[e, s]
        block, lane = c // in_block, c % in_block
        rows = [
            _linear_combination(
                (b[r, i], padded[b_, block, ty * m + r, tx * m + s, lane]) for r in range(alpha)
            )
            for i in range(alpha)
        ]
        return _by_position(e, rows)

    rows = te.compute((alpha, alpha, *tile_shape), input_rows, name=INPUT_ROWS_NAME)

    def transformed_input(e, v, b_, ty, tx, c):  # (B^T d B)[e, v]
        cols = [
            _linear_combination((b[s, j], rows[e, s, b_, ty, tx, c]) for s in range(alpha))
            for j in range(alpha)
        ]
        return _by_position(v, cols)

    v_ = te.compute((alpha, alpha, *tile_shape), transformed_input, name=INPUT_NAME)
    rc = te.reduce_axis((0, channels), name="rc")
    gemm = te.compute(
        (alpha, alpha, n, tiles_h, tiles_w, out_blocks, lanes),
        lambda e, v, b_, ty, tx, fb, fl: te.sum(
            v_[e, v, b_, ty, tx, rc] * u[e, v, fb, rc, fl], axis=rc
        ),
        name=GEMM_NAME,
    )

    def output_rows(i, v, b_, ty, tx, fb, fl):  # (A^T M)[i, v]
        rows = [
            _linear_combination((a[e, k], gemm[e, v, b_, ty, tx, fb, fl]) for e in range(alpha))
            for k in range(m)
        ]
        return _by_position(i, rows)

    out_rows = te.compute(
        (m, alpha, n, tiles_h, tiles_w, out_blocks, lanes), output_rows, name=OUTPUT_ROWS_NAME
    )

    def output(b_, fb, y, x_, fl):  # (A^T M A)[y % m, x % m]
        cols = [
            _linear_combination(
                (a[v, j], out_rows[y % m, v, b_, y // m, x_ // m, fb, fl]) for v in range(alpha)
            )
            for j in range(m)
        ]
        return _by_position(x_ % m, cols)

    return te.compute((n, out_blocks, out_h, out_w, lanes), output, name=WINOGRAD_NAME)
