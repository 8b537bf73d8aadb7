"""Constant matmul weights packed into column panels at compile time (CPU).

``x[..., m, k] @ W[k, n]`` reads a ``T``-column tile of ``W`` down all ``k`` rows: one cache
line per row, ``n * 4`` bytes apart. When ``n * 4`` is a multiple of 4 KiB (ViT's 3072
columns: 12 KiB) every row of the tile falls into the same L1 and L2 sets, so the tile does not
stay in cache: ViT-B/16's MLP layers ran 15-18x ONNX Runtime's time, the attention projection
(2,304 columns) 2.8x (docs/cpu-kernels.md, "Matrix products").

:class:`PackMatmulWeights` rewrites ``matmul(x, W)`` with a constant float32 ``W`` (or the
``permute_dims`` of a constant, as ONNX ``Gemm(transB=1)`` imports) into a call of the
PrimFunc ``matmul_packed(x, Wp)``, with ``Wp[n // T, k, n % T] = W[k, n]`` computed once here
(numpy): a panel of ``T`` columns is then ``k * T`` contiguous floats. The CPU rule
``MatmulKN`` schedules it with column tiles of ``T`` (the panel), so the loads stream. ``T``
is :func:`~.rules.base.panel_vectors` vectors of the target (four with AVX-512's 32
registers: 64 floats; two with AVX2's 16: 16 floats, so that ``MatmulKN``'s six-row tile
keeps its twelve accumulators in registers) or, when ``n`` is not a multiple of that, fewer.
The numbers are the same products summed in the same order, so outputs are bitwise equal.

A weight whose columns no vector count divides (the 1,000 classes of every ImageNet
classifier, with 16 lanes) is padded with zero columns to whole panels
(:func:`padded_panels`): unpacked, its column tiles read rows ``n * 4`` bytes apart
(ResNet-50's ``2048 x 1000`` classifier at batch 1: 694 us, ONNX Runtime's 368). The
product is computed ``n_padded`` wide and sliced back to ``n`` (one ``strided_slice``, into
which the bias add fuses). That product is opaque to FuseOps: fused into it, the slice would
be an epilogue of another shape, which ``MatmulKN`` cannot inline, and the kernel would run
unscheduled (MobileNet v3's classifier: 1.4 ms; docs/cpu-kernels.md, "Matrix products").

The pass runs in RTaskPrepare, as the llvm backend's own pass when the CPU rules are on
(``CPUBackend.prepare_passes``), before legalization; the call carries ``op_pattern`` 4
(output-elementwise fusable), so the bias add and activations still fuse into it.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te

from ...relax_exprs import (
    bound_value,
    call_te_padded,
    constant_array,
    op_name,
    rewrite_functions,
    static_shape_of,
)
from .rules.base import panel_vectors, registers_for_lanes

PACKED_NAME = "matmul_packed"


def panel_width(
    n: int, lanes: int, max_vectors: int = 4, choices: tuple[int, ...] = (4, 2, 1)
) -> int | None:
    """Columns per panel for ``n`` columns: ``choices`` vectors of ``lanes`` (at most
    ``max_vectors``), the first that divides ``n``; None when none does."""
    for vectors in choices:
        width = vectors * lanes
        if vectors <= max_vectors and n >= width and n % width == 0:
            return width
    return None


# at most this share of a padded weight's columns are zeros (wider panels first)
MAX_PADDING = 1 / 16


def padded_panels(n: int, lanes: int, max_vectors: int = 4) -> tuple[int, int] | None:
    """``(T, n_padded)`` for ``n`` columns that no vector count divides: the widest panel of
    four, two or one vectors (at most ``max_vectors``) whose zero columns are at most
    :data:`MAX_PADDING` of ``n_padded`` (else one vector); None under four vectors of
    columns, rows of at most four cache lines that a column tile reads whole anyway."""
    if n < 4 * lanes:
        return None
    for vectors in (v for v in (4, 2, 1) if v <= max_vectors):
        width = vectors * lanes
        padded = -(-n // width) * width
        if vectors == 1 or (padded - n) <= MAX_PADDING * padded:
            return width, padded
    return None


def pack_weight(weight: np.ndarray, width: int) -> np.ndarray:
    """``W[k, n]`` as ``Wp[n // width, k, n % width]`` (contiguous), zero columns appended
    up to a multiple of ``width``."""
    k, n = weight.shape
    padded = -(-n // width) * width
    if padded != n:
        weight = np.pad(weight, ((0, 0), (0, padded - n)))
    return np.ascontiguousarray(weight.reshape(k, padded // width, width).transpose(1, 0, 2))


def _matmul_packed(x: te.Tensor, packed: te.Tensor, n: int) -> te.Tensor:
    *batch, m_extent, k_extent = x.shape
    width = int(packed.shape[2])
    k = te.reduce_axis((0, k_extent), name="k")
    return te.compute(
        (*batch, m_extent, n),
        lambda *i: te.sum(x[(*i[:-1], k)] * packed[i[-1] // width, k, i[-1] % width], axis=k),
        name="matmul_packed",
    )


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, lanes: int, max_vectors: int) -> None:
        super().__init__(mod)
        self.lanes = lanes
        self.max_vectors = max_vectors

    def _bound(self, expr):
        return bound_value(self, expr)

    def _constant_weight(self, expr) -> np.ndarray | None:
        """The value of ``expr`` when it is a 2-D float32 constant, or the transpose of one."""
        expr = self._bound(expr)
        transpose = False
        if op_name(expr) == "relax.permute_dims":
            axes = expr.attrs.axes
            if axes is not None and [int(a) for a in axes] != [1, 0]:
                return None
            transpose, expr = True, self._bound(expr.args[0])
        if not isinstance(expr, tvm.ir.expr.Constant):
            return None
        value = constant_array(expr)
        if value.ndim != 2 or value.dtype != np.float32:
            return None
        return value.T if transpose else value

    def visit_call_(self, call):  # noqa: D102 (the mutator's hook)
        call = self.visit_expr_post_order(call)
        if op_name(call) != "relax.matmul":
            return call
        x, w = call.args
        x_shape = static_shape_of(x)
        if x_shape is None or len(x_shape) < 2 or str(x.ty.dtype) != "float32":
            return call
        if call.attrs.out_dtype not in ("", "float32", None):
            return call
        weight = self._constant_weight(w)
        if weight is None or weight.shape[0] != x_shape[-1]:
            return call
        n = weight.shape[1]
        width, padded = panel_width(n, self.lanes, self.max_vectors), n
        if width is None:
            found = padded_panels(n, self.lanes, self.max_vectors)
            if found is None:
                return call
            width, padded = found
        if padded == width:  # one panel: W is already contiguous
            return call
        return call_te_padded(
            self.builder_,
            _matmul_packed,
            x,
            relax.const(pack_weight(weight, width)),
            padded,
            name=PACKED_NAME,
            axis=len(x_shape) - 1,
            size=n,
            padded=padded,
        )


@tvm.transform.module_pass(opt_level=0, name="PackMatmulWeights")
class PackMatmulWeights:
    """Pack every constant matmul weight into panels of ``T`` columns (see the module
    docstring); ``lanes``: float32 lanes of the target's vectors, ``registers``: its vector
    registers (None: 32 for 16 lanes, AVX-512; else 16), which bound the panel's width."""

    def __init__(self, lanes: int, registers: int | None = None) -> None:
        self.lanes = lanes
        self.registers = registers if registers is not None else registers_for_lanes(lanes)

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        rewriter = _Rewriter(mod, self.lanes, panel_vectors(self.registers))
        return rewrite_functions(mod, rewriter)
