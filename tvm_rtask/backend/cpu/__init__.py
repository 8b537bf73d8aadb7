"""The CPU (llvm) backend: a vEU is one worker thread of TVM's pool, an rTask a chunk of an
operator's outer spatial loop, an rProgram one parallel launch (``dispatch.py``)."""

from .backend import CPUBackend

__all__ = ["CPUBackend"]
