"""The CUDA device helpers of the persistent kernels, as CUDA source files.

``pointer.cuh`` (a pointer as an integer and back, so one rKernel body takes whichever
operator's tensors), ``sync.cuh`` (bounded waits, signals, counters and epochs) and
``claim.cuh`` (the vEU claim by SM). The dispatcher injects them into the generated source
through ``T.cuda.func_call`` (``backend/cuda/dispatch.py``); each is guarded by its own
``#ifndef``, so a kernel that carries one several times defines it once.
"""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def device_source(name: str) -> str:
    """The text of helper file ``name``, starting on a line of its own."""
    return "\n" + resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
