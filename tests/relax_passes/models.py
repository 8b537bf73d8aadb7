"""Small Relax modules for the pass tests: two independent branches joined at the end."""

from __future__ import annotations

import numpy as np
import tvm
from tvm.script import relax as R


@tvm.script.ir_module
class TwoBranches:
    @R.function
    def main(x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((4, 4, 3, 3), "float32")):
        with R.dataflow():
            a = R.nn.conv2d(x, w, padding=1)
            b = R.nn.relu(x)
            c = R.add(R.nn.relu(a), b)
            R.output(c)
        return c


@tvm.script.ir_module
class SharedKernels:
    """Three convolutions of one shape (one PrimFunc) on different tensors, then a join."""

    @R.function
    def main(
        x: R.Tensor((1, 4, 8, 8), "float32"),
        w1: R.Tensor((4, 4, 3, 3), "float32"),
        w2: R.Tensor((4, 4, 3, 3), "float32"),
    ):
        with R.dataflow():
            a = R.nn.relu(R.nn.conv2d(x, w1, padding=1))
            b = R.nn.relu(R.nn.conv2d(x, w2, padding=1))
            c = R.nn.relu(R.nn.conv2d(a, w1, padding=1))
            d = R.add(b, c)
            R.output(d)
        return d


def shared_kernels_inputs(rng: np.random.Generator) -> list:
    """Arguments of :class:`SharedKernels`: weights that keep the three ReLUs alive."""
    x = rng.standard_normal((1, 4, 8, 8)).astype("float32")
    w1 = rng.standard_normal((4, 4, 3, 3)).astype("float32") * 0.5
    w2 = rng.standard_normal((4, 4, 3, 3)).astype("float32") * 0.5
    return [tvm.runtime.tensor(a) for a in (x, w1, w2)]
