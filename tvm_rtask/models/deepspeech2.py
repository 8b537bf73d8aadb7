"""DeepSpeech2, as Rammer evaluated it.

Amodei et al., "Deep Speech 2: End-to-End Speech Recognition in English and Mandarin", ICML
2016, in the configuration of microsoft/nnfusion ``artifacts/models/deepspeech2`` (after
TensorFlow's official ``deep_speech`` model): a spectrogram of 300 frames x 171 frequency
bins; two conv layers of 32 filters (41x11 stride 2x2 padding 20x5, then 21x11 stride 2x1
padding 10x5; no bias, ReLU6, BatchNorm); the result reshaped to 75 time steps of
86 x 32 = 2752 features; seven unidirectional LSTM layers (TensorFlow ``BasicLSTMCell``,
hidden 256, ``static_rnn``); the 75 outputs concatenated along the batch axis, BatchNorm and
a fully connected layer of 29 classes with bias. Output shape ``(75 * batch, 29)``.

The input is laid out NCHW as ``(batch, 1, frames, bins)``. TVM 0.27's ONNX importer has no
``LSTM`` operator, so the recurrent layers are unrolled cells (see ``_rnn.py``).
"""

from __future__ import annotations

from ._builder import GraphBuilder
from ._rnn import BasicLSTMCell, time_steps

SUMMARY = "DeepSpeech2, 2 conv + 7 LSTM(256) layers, 300 frames (Amodei et al. 2016)"
FULL = dict(frames=300, bins=171, filters=32, layers=7, hidden=256, classes=29)
REDUCED = dict(frames=20, bins=21, filters=4, layers=2, hidden=16, classes=29)


def build(batch: int = 1, seed: int = 0, **cfg):
    b = GraphBuilder("deepspeech2", seed)
    x = b.input("spectrogram", (batch, 1, cfg["frames"], cfg["bins"]))
    for k, stride, pads in (((41, 11), (2, 2), (20, 5)), ((21, 11), (2, 1), (10, 5))):
        x = b.batchnorm(b.clip(b.conv(x, cfg["filters"], k, stride, pads), 0.0, 6.0))
    n, c, steps, feats = x.shape
    x = b.reshape(b.transpose(x, (0, 2, 3, 1)), (n, steps, feats * c))
    seq = time_steps(b, x, axis=1)
    for _ in range(cfg["layers"]):
        cell = BasicLSTMCell(b, seq[0].shape[-1], cfg["hidden"])
        state, out = None, []
        for xt in seq:
            h, state = cell(xt, state)
            out.append(h)
        seq = out
    y = b.batchnorm(b.concat(seq, axis=0))
    b.output(b.linear(y, cfg["classes"], init="uniform"), "logits")
    return b.build(SUMMARY)
