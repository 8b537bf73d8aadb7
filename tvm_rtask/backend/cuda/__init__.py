"""The CUDA backend: a vEU is one persistent thread block, an rTask one thread block of the
source kernel, an rProgram one persistent kernel driven by a task table (``dispatch.py``)."""

from .backend import CUDABackend

__all__ = ["CUDABackend"]
