"""Seq2Seq: the LSTM encoder-decoder of Rammer's evaluation.

Ma et al., "Rammer", OSDI 2020 (Seq2Seq: encoder 8 / decoder 4 LSTM layers, hidden 128),
built as microsoft/nnfusion ``artifacts/models/seq2seq`` (after Sutskever et al., "Sequence
to Sequence Learning with Neural Networks", NIPS 2014): input ``(100, batch, 128)``; eight
stacked encoder LSTM layers (TensorFlow ``BasicLSTMCell``) over the 100 steps; a decoder of
four stacked LSTM layers with zero initial state, run for 30 steps, whose first input is the
final cell state ``c`` of the last encoder layer (as that code passes ``encoder_state[0]``)
and whose every later input is its own previous output. The output is the decoder's last
output, ``(batch, 128)``.

TVM 0.27's ONNX importer has no ``LSTM`` operator, so the cells are unrolled (``_rnn.py``).
"""

from __future__ import annotations

from ._builder import GraphBuilder
from ._rnn import BasicLSTMCell, time_steps

SUMMARY = "Seq2Seq, 8 encoder / 4 decoder LSTM(128) layers, 100 -> 30 steps (Rammer)"
FULL = dict(hidden=128, encoder_layers=8, encoder_steps=100, decoder_layers=4, decoder_steps=30)
REDUCED = dict(hidden=8, encoder_layers=2, encoder_steps=3, decoder_layers=2, decoder_steps=2)


def build(batch: int = 1, seed: int = 0, **cfg):
    b = GraphBuilder("seq2seq", seed)
    hidden = cfg["hidden"]
    x = b.input("input", (cfg["encoder_steps"], batch, hidden))
    seq = time_steps(b, x, axis=0)
    state = None
    for _ in range(cfg["encoder_layers"]):
        cell, state, out = BasicLSTMCell(b, hidden, hidden), None, []
        for xt in seq:
            h, state = cell(xt, state)
            out.append(h)
        seq = out
    cells = [BasicLSTMCell(b, hidden, hidden) for _ in range(cfg["decoder_layers"])]
    states = [None] * len(cells)
    cur = state[0]  # the final c of the last encoder layer
    for _ in range(cfg["decoder_steps"]):
        for layer, cell in enumerate(cells):
            cur, states[layer] = cell(cur, states[layer])
    b.output(cur, "output")
    return b.build(SUMMARY)
