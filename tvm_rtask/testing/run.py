"""Run a compiled Relax executable on named numpy inputs: one helper for tests and benches."""

from __future__ import annotations

import numpy as np


def run_executable(ex, inputs: dict[str, np.ndarray], dev=None) -> list[np.ndarray]:
    """``main`` of ``ex`` on ``inputs`` (in order) on ``dev`` (default CPU), outputs as numpy."""
    import tvm
    from tvm import relax

    dev = dev if dev is not None else tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    out = vm["main"](*(tvm.runtime.tensor(v, dev) for v in inputs.values()))
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
