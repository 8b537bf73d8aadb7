"""Unrolled LSTM cells.

TVM 0.27's ONNX importer has no ``LSTM`` (nor ``GRU``/``RNN``) operator, so every recurrent
model of the zoo is written as the static, unrolled graph of its cell: the form the Rammer
evaluation compiled (TensorFlow ``static_rnn`` graphs, one subgraph per time step and layer),
and the one that exposes the inter-operator parallelism between layers and time steps.

The zero initial state is not materialised: at the first step the terms that multiply it
(``h @ U``, ``c * sigmoid(f)``) are exact zeros and are left out.
"""

from __future__ import annotations

import math

import numpy as np

from ._builder import GraphBuilder, T


class BasicLSTMCell:
    """``tf.nn.rnn_cell.BasicLSTMCell``: ``[x, h] @ K + b`` sliced into gates i, j, f, o;
    ``c' = c * sigmoid(f + forget_bias) + sigmoid(i) * tanh(j)``, ``h' = tanh(c') * sigmoid(o)``.
    """

    def __init__(self, b: GraphBuilder, n_in: int, hidden: int, forget_bias: float = 1.0):
        self.b, self.n_in, self.hidden, self.forget_bias = b, n_in, hidden, forget_bias
        bound = 1.0 / math.sqrt(hidden)
        kernel = b.rng.uniform(-bound, bound, (n_in + hidden, 4 * hidden)).astype(np.float32)
        self.kernel = b.initializer(kernel, "lstm_kernel")
        # Used at the first step, where h is zero: the rows that multiply x only.
        self.kernel_x = b.initializer(kernel[:n_in].copy(), "lstm_kernel_x")
        self.bias = b.bias(4 * hidden, "lstm_bias")

    def __call__(self, x: T, state: tuple[T, T] | None) -> tuple[T, tuple[T, T]]:
        b, hidden = self.b, self.hidden
        if state is None:
            gates = b.matmul(x, self.kernel_x, 4 * hidden)
        else:
            gates = b.matmul(b.concat([x, state[1]], axis=1), self.kernel, 4 * hidden)
        gates = b.node("Add", [gates.name, self.bias], gates.shape)
        # Four Slices rather than one Split: a multi-output kernel stays an ordinary call
        # between rPrograms, while each Slice is an rKernel (and fuses into its consumer).
        i, j, f, o = (b.slice(gates, [g * hidden], [(g + 1) * hidden], [1]) for g in range(4))
        new_c = b.mul(b.sigmoid(i), b.tanh(j))
        if state is not None:
            new_c = b.add(b.mul(state[0], b.sigmoid(b.add(f, self.forget_bias))), new_c)
        new_h = b.mul(b.tanh(new_c), b.sigmoid(o))
        return new_h, (new_c, new_h)


class GateWiseLSTMCell:
    """The LSTM cell of Rammer's LSTM-TC benchmark: one ``x @ W_g + h @ U_g + b_g`` per gate
    (8 small matmuls per step), gates i, j, f, o and forget bias 1 as in BasicLSTMCell."""

    def __init__(self, b: GraphBuilder, n_in: int, hidden: int, forget_bias: float = 1.0):
        self.b, self.hidden, self.forget_bias = b, hidden, forget_bias
        bound = 1.0 / math.sqrt(hidden)
        self.w = [b.uniform((n_in, hidden), bound, "lstm_W") for _ in range(4)]
        self.u = [b.uniform((hidden, hidden), bound, "lstm_U") for _ in range(4)]
        self.bias = [b.bias(hidden, "lstm_b") for _ in range(4)]

    def __call__(self, x: T, state: tuple[T, T] | None) -> tuple[T, tuple[T, T]]:
        b, hidden = self.b, self.hidden
        gates = []
        for g in range(4):
            y = b.matmul(x, self.w[g], hidden)
            if state is not None:
                y = b.add(y, b.matmul(state[1], self.u[g], hidden))
            gates.append(b.node("Add", [y.name, self.bias[g]], y.shape))
        i, j, f, o = gates
        new_c = b.mul(b.sigmoid(i), b.tanh(j))
        if state is not None:
            new_c = b.add(b.mul(state[0], b.sigmoid(b.add(f, self.forget_bias))), new_c)
        new_h = b.mul(b.tanh(new_c), b.sigmoid(o))
        return new_h, (new_c, new_h)


def time_steps(b: GraphBuilder, x: T, axis: int) -> list[T]:
    """The per-step slices ``x[t]`` along ``axis`` (one Gather each, as TF's strided slices)."""
    return [b.take(x, t, axis) for t in range(x.shape[axis])]
