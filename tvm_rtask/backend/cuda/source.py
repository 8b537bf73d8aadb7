"""The generated CUDA source of a compiled executable."""

from __future__ import annotations


def cuda_source(ex) -> str:
    """The CUDA source of ``ex`` ("" when it has none)."""
    pending = [ex.mod]
    while pending:
        module = pending.pop()
        if module.kind == "cuda":
            return module.inspect_source()
        pending.extend(module.imports)
    return ""
