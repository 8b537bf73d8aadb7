"""LSTM-TC: the stacked LSTM of Rammer's evaluation.

Ma et al., "Rammer: Enabling Holistic Deep Learning Compiler Optimizations with rTasks",
OSDI 2020, Table 2 (LSTM-TC, 10 layers, hidden 256, sequence length 100), built as
microsoft/nnfusion ``artifacts/models/lstm/lstm_inference.py``: input ``(100, batch, 256)``,
ten LSTM layers whose cell computes each gate with its own pair of matmuls
(``x @ W_g + h @ U_g + b_g`` for i, j, f, o; forget bias 1), unrolled over the 100 steps; the
output is the last layer's hidden state at the last step, ``(batch, 256)``.

TVM 0.27's ONNX importer has no ``LSTM`` operator, so the cells are unrolled (``_rnn.py``).
"""

from __future__ import annotations

from ._builder import GraphBuilder
from ._rnn import GateWiseLSTMCell, time_steps

SUMMARY = "LSTM-TC, 10 layers, hidden 256, 100 steps (Rammer, OSDI 2020)"
FULL = dict(layers=10, hidden=256, steps=100)
REDUCED = dict(layers=2, hidden=8, steps=3)


def build(batch: int = 1, seed: int = 0, **cfg):
    b = GraphBuilder("lstm_tc", seed)
    hidden = cfg["hidden"]
    x = b.input("input", (cfg["steps"], batch, hidden))
    cells = [GateWiseLSTMCell(b, hidden, hidden) for _ in range(cfg["layers"])]
    states = [None] * cfg["layers"]
    for xt in time_steps(b, x, axis=0):
        for layer, cell in enumerate(cells):
            xt, states[layer] = cell(xt, states[layer])
    b.output(xt, "output")
    return b.build(SUMMARY)
