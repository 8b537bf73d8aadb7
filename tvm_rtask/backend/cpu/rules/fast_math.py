"""float32 ``exp``, ``erf``, ``sigmoid`` and ``tanh`` as arithmetic that LLVM vectorises.

TVM 0.27 lowers ``T.exp`` for llvm to ``llvm.exp.v16f32``, which the x86 backend splits into
16 calls of libm's ``expf``, and ``T.erf`` to scalar ``erff`` calls: a vectorised softmax or
GELU epilogue still runs one transcendental call per element (``sigmoid`` and ``tanh`` go
through ``llvm.exp`` too). :func:`vectorizable_math` rewrites all four, in a PrimFunc a rule
has scheduled, into polynomials of the classic forms:

- ``exp(x)``: ``x`` clamped to float32's range, ``n = round(x / ln 2)``,
  ``r = x - n ln 2`` (``ln 2`` split in two for accuracy), ``exp(r)`` by a degree-7
  polynomial (Cephes' ``expf`` coefficients), times ``2^n`` built from the exponent bits.
  Relative error about 2e-7.
- ``erf(x)``: for ``|x| >= 0.5`` Abramowitz and Stegun 7.1.26,
  ``1 - t (a1 + t (a2 + ...)) exp(-x^2)`` with ``t = 1 / (1 + p |x|)`` and the sign restored
  (absolute error below 1.5e-7); below 0.5 the Taylor series to ``x^9`` (relative error below
  4e-7).
- ``sigmoid(x)`` and ``tanh(x)`` (which TVM lowers through ``llvm.exp`` too) from that
  ``exp``: ``1 / (1 + exp(-x))`` and ``sign(x) (1 - exp(-2|x|)) / (1 + exp(-2|x|))``.

All stay within the numerics the project checks (relative error < 1e-4 against ONNX
Runtime), on models whose activations stay alive.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

EXP = tvm.ir.Op.get("tirx.exp")
ERF = tvm.ir.Op.get("tirx.erf")
SIGMOID = tvm.ir.Op.get("tirx.sigmoid")
TANH = tvm.ir.Op.get("tirx.tanh")
F32 = "float32"

EXP_MAX = 88.72283  # log of float32's largest finite value
EXP_MIN = -86.99  # n >= -125: 2^(n-1) stays a normal float (below: exp(-86.99), 1.9e-38)
LOG2E = 1.44269504088896341
LN2_HI = 0.693359375  # ln 2 = LN2_HI + LN2_LO, LN2_HI exact in few bits
LN2_LO = -2.12194440e-4
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
            1.6666665459e-1, 5.0000001201e-1)  # fmt: skip
ERF_P = 0.3275911
ERF_A = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)
TWO_OVER_SQRT_PI = 1.1283791670955126
ERF_SERIES = (1 / 216, -1 / 42, 1 / 10, -1 / 3, 1.0)  # x^8 .. x^0 terms of erf's series / x


def _f(value: float) -> tirx.PrimExpr:
    return tirx.const(value, F32)


def _horner(x: tirx.PrimExpr, coefficients) -> tirx.PrimExpr:
    acc = _f(coefficients[0])
    for c in coefficients[1:]:
        acc = acc * x + _f(c)
    return acc


def _let(value: tirx.PrimExpr, body, name: str) -> tirx.PrimExpr:
    """``body(v)`` with ``v`` bound once to ``value``: each rewrite below reads its operands
    several times, and as plain trees the nested reads multiplied (``exp`` read its argument
    25 times), which TVM's CommonSubexprElim then took seconds to fold back."""
    var = tirx.Var(name, value.ty)
    return tirx.Let(var, value, body(var))


def fast_exp(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """``exp(x)`` of a float32 expression as vectorisable arithmetic (see the module)."""

    def from_n(x, n):
        r = x - n * _f(LN2_HI) - n * _f(LN2_LO)
        return _let(r, lambda r: _scaled(_horner(r, EXP_POLY) * r * r + r + _f(1.0), n), "exp_r")

    def from_x(x):
        return _let(tirx.floor(x * _f(LOG2E) + _f(0.5)), lambda n: from_n(x, n), "exp_n")

    return _let(tirx.max(tirx.min(x, _f(EXP_MAX)), _f(EXP_MIN)), from_x, "exp_x")


def _scaled(poly: tirx.PrimExpr, n: tirx.PrimExpr) -> tirx.PrimExpr:
    """``poly * 2^n``: 2^(n-1) * 2, since n runs from -125 to 128, so the biased exponent
    n - 1 + 127 stays in 1..254 (a plain 2^n would overflow the exponent field at n = 128)."""
    exponent = tirx.Cast("int32", n) + tirx.const(126, "int32")
    half_two_n = tirx.reinterpret(F32, tirx.shift_left(exponent, tirx.const(23, "int32")))
    return poly * half_two_n * _f(2.0)


def fast_erf(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """``erf(x)`` of a float32 expression as vectorisable arithmetic (see the module)."""

    def from_t(x, ax, t):
        y = _f(1.0) - _horner(t, ERF_A) * t * fast_exp(-ax * ax)
        # near 0 the series keeps the relative error small: 2/sqrt(pi) (x - x^3/3 + ...)
        series = x * _f(TWO_OVER_SQRT_PI) * _horner(x * x, ERF_SERIES)
        return _let(
            y, lambda y: tirx.Select(ax < _f(0.5), series, tirx.Select(x < _f(0.0), -y, y)), "erf_y"
        )

    def from_ax(x, ax):
        return _let(_f(1.0) / (_f(1.0) + _f(ERF_P) * ax), lambda t: from_t(x, ax, t), "erf_t")

    return _let(x, lambda x: _let(tirx.abs(x), lambda ax: from_ax(x, ax), "erf_ax"), "erf_x")


def fast_sigmoid(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """``1 / (1 + exp(-x))`` with :func:`fast_exp` (saturates to 0 and 1)."""
    return _f(1.0) / (_f(1.0) + fast_exp(-x))


def fast_tanh(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """``tanh(x)`` as ``sign(x) (1 - e) / (1 + e)`` with ``e = exp(-2 |x|)`` (no overflow)."""

    def from_e(x, e):
        return _let(
            (_f(1.0) - e) / (_f(1.0) + e), lambda y: tirx.Select(x < _f(0.0), -y, y), "tanh_y"
        )

    return _let(
        x,
        lambda x: _let(fast_exp(_f(-2.0) * tirx.abs(x)), lambda e: from_e(x, e), "tanh_e"),
        "tanh_x",
    )


FAST = {EXP: fast_exp, ERF: fast_erf, SIGMOID: fast_sigmoid, TANH: fast_tanh}


def vectorizable_math(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every float32 ``exp``, ``erf``, ``sigmoid`` and ``tanh`` call rewritten
    (see the module)."""

    def rewrite(call):
        if str(call.ty) != F32 or len(call.args) != 1:
            return call
        for op, fast in FAST.items():
            if call.op.same_as(op):
                return fast(call.args[0])
        return call

    return func.with_body(tvm_ffi.structural_map(func.body, (tvm.ir.expr.Call, rewrite)))


def calls_transcendental(stmt: tirx.Stmt) -> bool:
    """True when ``stmt`` calls ``exp``, ``erf``, ``sigmoid`` or ``tanh``: once rewritten
    (:func:`vectorizable_math`) each call is a few dozen instructions, so an unrolled loop
    around it multiplies what LLVM compiles."""
    found = []

    def visit(call):
        if any(call.op.same_as(op) for op in FAST):
            found.append(call)

    tvm_ffi.structural_walk(stmt, (tvm.ir.expr.Call, visit))
    return bool(found)
